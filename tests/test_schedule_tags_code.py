"""`SCHEDULE_TOPIC_XXXX` consume-queue tagsCode = delivery time (spec §14), on the parse path
(`check_message_and_return_size`, what reput and recovery dispatch), on the put path (`RecordEncoder`
+ `CommitLog._append`), and the broker's `ScheduleMessageService` reading it back."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rmq_eventstore.broker.schedule import ScheduleMessageService, transform_delay_level_message
from rmq_eventstore.common import codec
from rmq_eventstore.store import Message, MessageStore, PutMessageStatus
from rmq_eventstore.store.config import DEFAULT_DELAY_LEVELS_MS, parse_delay_levels

HOST = (b"\x7f\x00\x00\x01", 10911)
T = 1_700_000_000_123


def _record(topic: str, props: str, store_timestamp: int = T) -> bytearray:
    return codec.encode_record(topic=topic, body=b"x", properties_string=props, born_host=HOST,
                               store_host=HOST, store_timestamp=store_timestamp, born_timestamp=T - 5)


def _tags_code(buf: bytearray, **kw: object) -> int:
    r = codec.check_message_and_return_size(buf, 0, False, len(buf), **kw)
    assert r.success and r.request is not None, r.reason
    return r.request.tags_code


def test_parse_delay_levels() -> None:
    assert parse_delay_levels("1s 5m 2h 1d") == [1000, 300_000, 7_200_000, 86_400_000]
    assert DEFAULT_DELAY_LEVELS_MS[0] == 1000 and DEFAULT_DELAY_LEVELS_MS[-1] == 7_200_000
    assert len(DEFAULT_DELAY_LEVELS_MS) == 18
    for bad in ("", "1x", "s", "1.5s", "-1s", "１s"):
        with pytest.raises(ValueError):
            parse_delay_levels(bad)


def test_parse_path_gives_schedule_records_their_delivery_time() -> None:
    tags = "TAGS\x01tg\x02"
    hash_code = codec.tags_string_to_tags_code("tg")
    sched = codec.SCHEDULE_TOPIC
    assert _tags_code(_record(sched, tags + "DELAY\x013\x02REAL_TOPIC\x01t\x02")) == T + 10_000
    assert _tags_code(_record(sched, "DELAY\x0199\x02")) == T + 7_200_000  # clamped to the last level
    assert _tags_code(_record(sched, "DELAY\x01+2\x02"), delay_levels=(7, 11)) == T + 11
    assert _tags_code(_record(sched, tags + "DELAY\x010\x02")) == hash_code  # level <= 0: the tag hash
    assert _tags_code(_record(sched, tags + "DELAY\x01-4\x02")) == hash_code
    assert _tags_code(_record(sched, tags)) == hash_code  # no DELAY
    assert _tags_code(_record("plain", tags + "DELAY\x013\x02")) == hash_code  # other topics keep the hash
    # Integer.parseInt failing makes Java's checkMessageAndReturnSize fail the record
    buf = _record(sched, "DELAY\x01three\x02")
    r = codec.check_message_and_return_size(buf, 0, False, len(buf))
    assert not r.success and r.size == -1


def _cq_tags_codes(store: MessageStore, queue_id: int) -> list[int]:
    assert store.wait_for_dispatch()
    cq = store.find_consume_queue(codec.SCHEDULE_TOPIC, queue_id, create=False)
    assert cq is not None
    return [u[2] for u in cq.get_units(0, 100)]


def _reparsed(store: MessageStore, queue_id: int) -> list[int]:
    """What the reput would dispatch for the same records (the parse path with the store's levels)."""
    cq = store.find_consume_queue(codec.SCHEDULE_TOPIC, queue_id, create=False)
    out = []
    for phy, size, _code in cq.get_units(0, 100):
        buf = store.commit_log.read_record(phy)
        out.append(_tags_code(buf[:size], delay_levels=store.commit_log.encoder.delay_levels))
    return out


def test_put_path_writes_the_delivery_time_as_tags_code(open_store: Callable[..., MessageStore]) -> None:
    store = open_store(message_delay_level="3s 7s")
    sched = codec.SCHEDULE_TOPIC
    one = store.put_message(Message(sched, b"a", queue_id=1, properties_string="TAGS\x01tg\x02DELAY\x012\x02"))
    assert one.is_ok()
    batch = store.put_messages([Message(sched, b"b", queue_id=1, properties_string="DELAY\x019\x02"),
                                Message(sched, b"c", queue_id=1, properties_string="DELAY\x010\x02TAGS\x01q\x02"),
                                Message(sched, b"d", queue_id=1, tags="plain")])
    assert batch.is_ok()
    t1 = one.append_result.store_timestamp
    t2 = batch.append_result.store_timestamp
    assert _cq_tags_codes(store, 1) == [t1 + 7000, t2 + 7000, codec.tags_string_to_tags_code("q"),
                                        codec.tags_string_to_tags_code("plain")]
    assert _reparsed(store, 1) == _cq_tags_codes(store, 1)


def test_put_path_refuses_a_delay_java_cannot_parse(store: MessageStore) -> None:
    r = store.put_message(Message(codec.SCHEDULE_TOPIC, b"a", properties_string="DELAY\x01soon\x02"))
    assert r.status == PutMessageStatus.MESSAGE_ILLEGAL and "DELAY" in r.reason
    # other topics carry any DELAY text (the broker's hook ignores it there)
    assert store.put_message(Message("t", b"a", properties_string="DELAY\x01soon\x02")).is_ok()


def test_recovery_rebuilds_schedule_units_with_delivery_times(open_store: Callable[..., MessageStore],
                                                              store_path: Path) -> None:
    store = open_store(message_delay_level="2s")
    r = store.put_message(Message(codec.SCHEDULE_TOPIC, b"a", properties_string="DELAY\x011\x02"))
    ts = r.append_result.store_timestamp
    store.shutdown()
    for f in (store_path / "consumequeue").rglob("*"):  # lose the consume queue: rebuilt from the log
        if f.is_file():
            f.unlink()
    store = open_store(message_delay_level="2s")
    assert _cq_tags_codes(store, 0) == [ts + 2000]


def _delay_message(level: int) -> Message:
    m = Message("real", b"later", queue_id=2, properties_string=f"DELAY\x01{level}\x02")
    assert transform_delay_level_message(m, 18)
    return m


def test_schedule_service_delivers_by_the_consume_queue_delivery_time(
        open_store: Callable[..., MessageStore]) -> None:
    # written while level 1 meant 0 s: its tagsCode says "due at its store time"
    store = open_store(message_delay_level="0s 0s")
    assert store.put_message(_delay_message(1)).is_ok()
    # the service now runs with 1 h levels; RocketMQ trusts the unit's tagsCode and delivers at once,
    # where recomputing store time + 1 h from the record would wait an hour
    svc = ScheduleMessageService(store, "1h 1h")
    assert store.commit_log.encoder.delay_levels == (3_600_000, 3_600_000)
    assert store.wait_for_dispatch()
    assert svc.deliver_level(1) == 1
    assert store.wait_for_dispatch()
    assert store.get_max_offset_in_queue("real", 2) == 1
    # a message stored under the 1 h levels is not due
    assert store.put_message(_delay_message(2)).is_ok()
    assert _cq_tags_codes(store, 1)[0] > time.time() * 1000 + 3_500_000
    assert svc.deliver_level(2) == 0  # (dispatched: _cq_tags_codes waited)
    assert store.get_max_offset_in_queue("real", 2) == 1
    assert store.delay_offset_manager.query_offset(1) == 1
    assert store.delay_offset_manager.query_offset(2) == 0
