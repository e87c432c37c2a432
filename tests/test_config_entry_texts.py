"""topics.json and subscriptionGroup.json are written whole after every change (as RocketMQ does), and writing
them encoded every entry each time: creating or deleting one topic among 10,000 cost 230 ms of encoding (a
Celery `inspect` declares and deletes a reply queue: two topic writes). Each entry is now encoded once and its
text kept while the table holds it: a change encodes the changed entry. The files must stay byte for byte what
encoding the whole table gives (checked against `fastjson_dumps` of the table written plainly)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rmq_eventstore.common.fastjson import Bean, fastjson_dumps
from rmq_eventstore.common.topic_config import SubscriptionGroupConfig, TopicConfig
from rmq_eventstore.store.config_files import SubscriptionGroupManager, TopicConfigManager


def plain_topics(m: TopicConfigManager, pretty: bool) -> str:
    return fastjson_dumps(Bean(dataVersion=m.data_version, topicConfigTable={
        c.topic_name: c.to_bean() for c in m.list()}), pretty)


def plain_groups(m: SubscriptionGroupManager, pretty: bool) -> str:
    return fastjson_dumps(Bean(dataVersion=m.data_version, forbiddenTable=m.forbidden_table(),
                               subscriptionGroupTable={c.group_name: c.to_bean() for c in m.list()}), pretty)


def test_topics_file_is_what_the_whole_table_encodes(tmp_path: Path) -> None:
    m = TopicConfigManager(tmp_path)
    for i in range(50):
        m.put(TopicConfig(f"t{i}", 1 + i % 8, 1 + i % 8, order=i % 5 == 0, attributes={"+k": str(i)} if i % 7 else {}))
    for pretty in (True, False):
        assert m.encode(pretty) == plain_topics(m, pretty)
    m.put(TopicConfig("t3", 16, 16, perm=4))  # replaced
    m.delete("t4")
    m.put(TopicConfig("t4", 2, 2))  # deleted, then created again: at the end of the table
    for pretty in (True, False):
        assert m.encode(pretty) == plain_topics(m, pretty)
    with open(m.config_file_path()) as f:
        assert f.read() == plain_topics(m, True)
    again = TopicConfigManager(tmp_path)
    assert again.load() and [c.to_bean() for c in again.list()] == [c.to_bean() for c in m.list()]
    for i in range(50):  # every topic deleted: the kept texts go with them
        m.delete(f"t{i}")
    assert m.encode(True) == plain_topics(m, True) and len(m._texts._texts) <= 64 + 2


def test_groups_file_is_what_the_whole_table_encodes(tmp_path: Path) -> None:
    m = SubscriptionGroupManager(tmp_path)
    for i in range(30):
        m.put(SubscriptionGroupConfig(f"g{i}", retry_queue_nums=i % 3, consume_broadcast_enable=bool(i % 2)))
    m.update_forbidden("g1", "t", 2, True)
    m.put(SubscriptionGroupConfig("g2", retry_max_times=3))
    m.delete("g5")
    for pretty in (True, False):
        assert m.encode(pretty) == plain_groups(m, pretty)
    with open(m.config_file_path()) as f:
        assert f.read() == plain_groups(m, True)


def test_a_change_encodes_the_changed_entry_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = TopicConfigManager(tmp_path)
    for i in range(2000):
        m._table[f"queue{i}"] = TopicConfig(f"queue{i}", 4, 4)  # a table as loaded at start
    m.persist()
    encoded: list[str] = []
    to_bean = TopicConfig.to_bean

    def counting(self: TopicConfig) -> Bean:
        encoded.append(self.topic_name)
        return to_bean(self)

    monkeypatch.setattr(TopicConfig, "to_bean", counting)
    m.put(TopicConfig("reply_celery_pidbox_x", 1, 1))
    m.delete("queue7")
    assert encoded == ["reply_celery_pidbox_x"]  # was 2,001 + 2,000
    monkeypatch.undo()
    with open(m.config_file_path()) as f:
        assert f.read() == plain_topics(m, True)
