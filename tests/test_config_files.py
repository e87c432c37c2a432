"""Config JSON files under <root>/config/ (spec §13): fastjson dialect, crash-safe .bak persistence,
and the four managers (topics, consumer offsets, subscription groups, delay offsets)."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from golden import SPEC_DIR
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.common.fastjson import (
    Bean,
    ConfigFileError,
    _parse_lenient,
    fastjson_dumps,
    fastjson_loads,
)
from rmq_eventstore.common.topic import TopicValidationError
from rmq_eventstore.common.topic_config import DataVersion, SubscriptionGroupConfig, TopicConfig
from rmq_eventstore.store.config_files import (
    ConfigManager,
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfigManager,
    read_config_file,
    write_config_file,
)

TS = 1700000000000

# --- the spec's examples (§13.3-13.6), byte for byte: TAB indentation, no trailing newline ---------------

TOPICS_JSON = (
    '{\n\t"dataVersion":{\n\t\t"counter":2,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t},\n'
    '\t"topicConfigTable":{\n\t\t"TopicTest":{\n\t\t\t"attributes":{},\n\t\t\t"order":false,\n'
    '\t\t\t"perm":6,\n\t\t\t"readQueueNums":4,\n\t\t\t"topicFilterType":"SINGLE_TAG",\n'
    '\t\t\t"topicName":"TopicTest",\n\t\t\t"topicSysFlag":0,\n\t\t\t"writeQueueNums":4\n\t\t}\n\t}\n}'
)

CONSUMER_OFFSET_JSON = (
    '{\n\t"dataVersion":{\n\t\t"counter":0,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t},\n'
    '\t"groupTopicMap":{\n\t\t"GID_demo":["TopicTest","%RETRY%GID_demo"]\n\t},\n'
    '\t"offsetTable":{\n\t\t"TopicTest@GID_demo":{0:120,1:118,2:119,3:121\n\t\t},\n'
    '\t\t"%RETRY%GID_demo@GID_demo":{0:0\n\t\t}\n\t}\n}'
)

SUBSCRIPTION_GROUP_JSON = (
    '{\n\t"dataVersion":{\n\t\t"counter":1,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t},\n'
    '\t"forbiddenTable":{},\n\t"subscriptionGroupTable":{\n\t\t"GID_demo":{\n\t\t\t"attributes":{},\n'
    '\t\t\t"brokerId":0,\n\t\t\t"consumeBroadcastEnable":true,\n\t\t\t"consumeEnable":true,\n'
    '\t\t\t"consumeFromMinEnable":true,\n\t\t\t"consumeMessageOrderly":false,\n'
    '\t\t\t"consumeTimeoutMinute":15,\n\t\t\t"groupName":"GID_demo",\n\t\t\t"groupRetryPolicy":{\n'
    '\t\t\t\t"type":"CUSTOMIZED"\n\t\t\t},\n\t\t\t"groupSysFlag":0,\n'
    '\t\t\t"notifyConsumerIdsChangedEnable":true,\n\t\t\t"retryMaxTimes":16,\n'
    '\t\t\t"retryQueueNums":1,\n\t\t\t"whichBrokerWhenConsumeSlowly":1\n\t\t}\n\t}\n}'
)

DELAY_OFFSET_JSON = (
    '{\n\t"dataVersion":{\n\t\t"counter":0,\n\t\t"stateVersion":0,\n\t\t"timestamp":1700000000000\n\t},\n'
    '\t"offsetTable":{1:5,3:2\n\t}\n}'
)


def test_spec_examples_are_transcribed_exactly() -> None:
    """Guard: the literals above are the spec's fenced examples (when the spec is available)."""
    spec = SPEC_DIR / "rocketmq-store-format.md"
    if not spec.exists():
        pytest.fail(f"the store format spec {spec} is missing (shared/ must sit beside the repository)",
                    pytrace=False)
    text = spec.read_text(encoding="utf-8")
    section = text[text.index("### 13.3") : text.index("## 14.")]
    blocks = [b.split("```", 1)[0].strip("\n") for b in section.split("```\n")[1::2]]
    assert blocks == [TOPICS_JSON, CONSUMER_OFFSET_JSON, SUBSCRIPTION_GROUP_JSON, DELAY_OFFSET_JSON]


# --- exact output of the managers -------------------------------------------------------------------


def test_topics_json_exact(tmp_path: Path) -> None:
    mgr = TopicConfigManager(tmp_path / "config")
    mgr.put(TopicConfig("TopicTest", read_queue_nums=4, write_queue_nums=4))
    mgr.data_version = DataVersion(counter=2, state_version=0, timestamp=TS)
    assert mgr.encode() == TOPICS_JSON
    mgr.persist()
    assert (tmp_path / "config" / "topics.json").read_bytes() == TOPICS_JSON.encode()


def test_consumer_offset_json_exact(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path / "config")
    for queue_id, offset in enumerate([120, 118, 119, 121]):
        mgr.commit_offset("GID_demo", "TopicTest", queue_id, offset)
    mgr.commit_offset("GID_demo", "%RETRY%GID_demo", 0, 0)
    mgr.data_version = DataVersion(counter=0, state_version=0, timestamp=TS)
    assert mgr.encode() == CONSUMER_OFFSET_JSON
    mgr.persist()
    assert Path(mgr.config_file_path()).read_bytes() == CONSUMER_OFFSET_JSON.encode()


def test_subscription_group_json_exact(tmp_path: Path) -> None:
    mgr = SubscriptionGroupManager(tmp_path / "config")
    mgr.put(SubscriptionGroupConfig("GID_demo"))
    mgr.data_version = DataVersion(counter=1, state_version=0, timestamp=TS)
    assert mgr.encode() == SUBSCRIPTION_GROUP_JSON
    mgr.persist()
    assert Path(mgr.config_file_path()).read_bytes() == SUBSCRIPTION_GROUP_JSON.encode()


def test_delay_offset_json_exact(tmp_path: Path) -> None:
    mgr = DelayOffsetManager(tmp_path / "config")
    mgr.update_offset(1, 5)
    mgr.update_offset(3, 2)
    mgr.data_version = DataVersion(counter=0, state_version=0, timestamp=TS)
    assert mgr.encode() == DELAY_OFFSET_JSON
    mgr.persist()
    assert Path(mgr.config_file_path()).read_bytes() == DELAY_OFFSET_JSON.encode()


def test_fastjson_dumps_of_plain_structures_matches_spec() -> None:
    dv = Bean(timestamp=TS, counter=0, stateVersion=0)  # bean fields get sorted
    doc = Bean(
        offsetTable={
            "TopicTest@GID_demo": {0: 120, 1: 118, 2: 119, 3: 121},
            "%RETRY%GID_demo@GID_demo": {0: 0},
        },
        groupTopicMap={"GID_demo": ["TopicTest", "%RETRY%GID_demo"]},
        dataVersion=dv,
    )
    assert fastjson_dumps(doc) == CONSUMER_OFFSET_JSON
    assert fastjson_dumps(Bean(dataVersion=dv, offsetTable={1: 5, 3: 2})) == DELAY_OFFSET_JSON


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        ({}, "{}"),
        (Bean(), "{}"),
        ([], "[]"),
        ({1: 2}, "{1:2\n}"),
        ({-1: -2}, "{-1:-2\n}"),
        ({"a": 1}, '{\n\t"a":1\n}'),
        ({"a": {}}, '{\n\t"a":{}\n}'),
        ({"a": None, "b": 1}, '{\n\t"b":1\n}'),
        (Bean(b=1, a=None), '{\n\t"b":1\n}'),
        ({"a": [1, "x", True, None]}, '{\n\t"a":[1,"x",true,null]\n}'),
        ({"k": {0: {"x": 1}}}, '{\n\t"k":{0:{\n\t\t\t"x":1\n\t\t}\n\t}\n}'),
        ("中文é", '"中文é"'),
        ('q"b\\s/\n\t\x01', '"q\\"b\\\\s/\\n\\t\\u0001"'),
        (True, "true"),
        (False, "false"),
        (None, "null"),
        (-5, "-5"),
        (1.5, "1.5"),
        ([Bean(topic="t", expression="*")], '[{\n\t"expression":"*",\n\t"topic":"t"\n}]'),
    ],
)
def test_fastjson_dumps_shapes(obj: Any, expected: str) -> None:
    assert fastjson_dumps(obj) == expected


def test_fastjson_dumps_compact() -> None:
    doc = Bean(b={"x": {0: 1, 2: 3}}, a=[1, 2])
    assert fastjson_dumps(doc, pretty=False) == '{"a":[1,2],"b":{"x":{0:1,2:3}}}'


def test_fastjson_dumps_raw_utf8_and_no_trailing_newline(tmp_path: Path) -> None:
    mgr = TopicConfigManager(tmp_path)
    mgr.put(TopicConfig("T", attributes={"note": "日本語"}))
    data = Path(mgr.config_file_path()).read_bytes()
    assert "日本語".encode() in data and b"\\u" not in data
    assert not data.endswith(b"\n") and data.endswith(b"}")


def test_fastjson_dumps_rejects_unknown_types() -> None:
    with pytest.raises(TypeError):
        fastjson_dumps(object())
    with pytest.raises(TypeError):
        fastjson_dumps({(1, 2): 3})


# --- reader -----------------------------------------------------------------------------------------


def test_parse_spec_consumer_offset_example() -> None:
    doc = fastjson_loads(CONSUMER_OFFSET_JSON)
    assert doc["offsetTable"]["TopicTest@GID_demo"] == {0: 120, 1: 118, 2: 119, 3: 121}
    assert doc["offsetTable"]["%RETRY%GID_demo@GID_demo"] == {0: 0}
    assert all(isinstance(k, int) for k in doc["offsetTable"]["TopicTest@GID_demo"])
    assert doc["dataVersion"] == {"counter": 0, "stateVersion": 0, "timestamp": TS}
    assert fastjson_loads(DELAY_OFFSET_JSON)["offsetTable"] == {1: 5, 3: 2}


def test_loads_accepts_quoted_and_unquoted_keys_and_plain_json() -> None:
    assert fastjson_loads('{"0":10,"1":12}') == {"0": 10, "1": 12}
    assert fastjson_loads("{0:10,1:12}") == {0: 10, 1: 12}
    assert fastjson_loads('{ -1 : 5 , "a" : [ 1 , 2 ] }') == {-1: 5, "a": [1, 2]}
    assert fastjson_loads('\ufeff{"a":1,}') == {"a": 1}
    assert fastjson_loads(b'{"a":"\xc3\xa9"}') == {"a": "é"}
    assert fastjson_loads('{"a":"x,1:y"}') == {"a": "x,1:y"}  # no key rewriting inside strings
    assert fastjson_loads('{"a":"x,1:y",2:3}') == {"a": "x,1:y", 2: 3}
    assert fastjson_loads("[1.5, -2e3, true, false, null]") == [1.5, -2000.0, True, False, None]


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "   ",
        "garbage",
        "{",
        "{0:}",
        '{"a":1',
        '{"a" 1}',
        "{a:1}",
        "[1,2",
        '{"a":1}}',
        '{"a":"unterminated}',
        "NaN",
        "{0:NaN}",
        '{"a":01}',
        "\x00\x00\x00\x00",
        b"\xff\xfe{}",
        '{"a":1}\x00',
        "[" * 5000,
    ],
)
def test_loads_garbage_raises_config_file_error(garbage: str | bytes) -> None:
    with pytest.raises(ConfigFileError):
        fastjson_loads(garbage)


def test_loads_error_message_has_position() -> None:
    with pytest.raises(ConfigFileError, match=r"line 2 column 6"):
        fastjson_loads('{\n\t"a" 1}')


@given(st.text(max_size=60))
def test_loads_never_raises_anything_else(text: str) -> None:
    try:
        fastjson_loads(text)
    except ConfigFileError:
        pass


_long = st.integers(min_value=-(2**63), max_value=2**63 - 1)
_leaf = st.one_of(st.text(), _long, st.booleans())
_json_tree = st.recursive(
    _leaf,
    lambda children: st.one_of(
        st.lists(children, max_size=5),
        st.dictionaries(st.text(), children, max_size=5),
        st.dictionaries(_long, children, max_size=5),
        st.dictionaries(st.text(max_size=8), children, max_size=5).map(Bean),
    ),
    max_leaves=30,
)


@settings(max_examples=300, deadline=None)
@given(_json_tree, st.booleans())
def test_round_trip(obj: Any, pretty: bool) -> None:
    text = fastjson_dumps(obj, pretty=pretty)
    assert fastjson_loads(text) == obj
    assert fastjson_loads(text.encode("utf-8")) == obj


@settings(max_examples=300, deadline=None)
@given(_json_tree, st.booleans(), st.sampled_from(["", " ", "\n\t"]))
def test_fast_and_exact_parsers_agree(obj: Any, pretty: bool, pad: str) -> None:
    # Padding around every ':' also hits ':' inside strings (making some texts invalid): then both
    # parsers must refuse; otherwise both must return the same value.
    text = fastjson_dumps(obj, pretty=pretty).replace(":", pad + ":" + pad)
    try:
        exact = _parse_lenient(text)
    except ConfigFileError:
        with pytest.raises(ConfigFileError):
            fastjson_loads(text)
    else:
        assert fastjson_loads(text) == exact


@settings(max_examples=100, deadline=None)
@given(st.dictionaries(st.text(), st.text()))
def test_string_maps_are_standard_json(obj: dict[str, str]) -> None:
    assert json.loads(fastjson_dumps(obj)) == obj


# --- ConfigManagerTest (CT/ConfigManagerTest): load, loadBak, persist -------------------------------


class _DemoConfigManager(ConfigManager):
    """A minimal manager holding one string-keyed table, like RocketMQ's test double."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path
        self.table: dict[str, Any] = {}

    def config_file_path(self) -> str:
        return str(self.path)

    def encode(self, pretty: bool = True) -> str:
        return fastjson_dumps(self.table, pretty)

    def decode(self, text: str) -> None:
        doc = fastjson_loads(text)
        if not isinstance(doc, dict):
            raise ConfigFileError("not an object")
        self.table = doc


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode() if isinstance(text, str) else text)


def test_load_main_file(tmp_path: Path) -> None:
    path = tmp_path / "config" / "demo.json"
    _write(path, '{"k":"main"}')
    _write(Path(str(path) + ".bak"), '{"k":"bak"}')
    mgr = _DemoConfigManager(path)
    assert mgr.load()
    assert mgr.table == {"k": "main"}


@pytest.mark.parametrize("main", [None, "", "{broken", b"\xff\xfe\x00", "[1, 2]"])
def test_load_bak_when_main_missing_empty_or_corrupt(tmp_path: Path, main: str | bytes | None) -> None:
    path = tmp_path / "demo.json"
    if main is not None:
        _write(path, main)
    _write(Path(str(path) + ".bak"), '{"k":"bak"}')
    mgr = _DemoConfigManager(path)
    assert mgr.load()
    assert mgr.table == {"k": "bak"}
    # read_config_file's default check is "parses as fastjson": a JSON list passes it, the rest do not.
    assert read_config_file(path) == ("[1, 2]" if main == "[1, 2]" else '{"k":"bak"}')


def test_load_nothing_is_success_and_empty(tmp_path: Path) -> None:
    mgr = _DemoConfigManager(tmp_path / "absent.json")
    assert mgr.load()
    assert mgr.table == {}
    assert read_config_file(tmp_path / "absent.json") is None


def test_load_fails_only_when_bak_is_needed_and_bad(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    _write(path, "{broken")
    _write(Path(str(path) + ".bak"), "{also broken")
    mgr = _DemoConfigManager(path)
    assert mgr.load() is False
    with pytest.raises(ConfigFileError, match="demo.json"):
        read_config_file(path)
    # Main corrupt and no backup: RocketMQ starts empty (loadBak returns true).
    os.remove(str(path) + ".bak")
    assert mgr.load() is True


def test_load_ignores_stale_tmp_files(tmp_path: Path) -> None:
    path = tmp_path / "demo.json"
    _write(path, '{"k":"main"}')
    _write(Path(str(path) + ".tmp"), '{"k":"half-writ')
    _write(Path(str(path) + ".bak.tmp"), "junk")
    mgr = _DemoConfigManager(path)
    assert mgr.load() and mgr.table == {"k": "main"}
    os.remove(path)
    assert mgr.load() and mgr.table == {"k": "main"}  # unchanged: nothing to load, .tmp ignored
    assert read_config_file(path) is None


def test_persist_writes_content_and_bak_with_previous_content(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "dir" / "demo.json"  # parents created
    mgr = _DemoConfigManager(path)
    mgr.table = {"v": 1}
    mgr.persist()
    assert path.read_text() == '{\n\t"v":1\n}'
    assert not Path(str(path) + ".bak").exists()  # nothing to back up yet
    mgr.table = {"v": 2}
    mgr.persist()
    assert path.read_text() == '{\n\t"v":2\n}'
    assert Path(str(path) + ".bak").read_text() == '{\n\t"v":1\n}'
    mgr.table = {"v": 3}
    mgr.persist()
    assert Path(str(path) + ".bak").read_text() == '{\n\t"v":2\n}'
    assert not list(path.parent.glob("*.tmp"))


def test_write_config_file_backs_up_existing_empty_file(tmp_path: Path) -> None:
    """MixAll.string2File copies an existing (even empty) file to .bak: how abort.bak appears (§9.1)."""
    abort = tmp_path / "abort"
    abort.touch()
    write_config_file(abort, "12345")
    assert abort.read_text() == "12345"
    assert Path(str(abort) + ".bak").read_bytes() == b""
    write_config_file(abort, "678")
    assert Path(str(abort) + ".bak").read_text() == "12345"


def test_read_config_file_without_validation(tmp_path: Path) -> None:
    path = tmp_path / "plain"
    write_config_file(path, "not json")
    assert read_config_file(path, validate=None) == "not json"
    assert read_config_file(path) is None  # invalid JSON, no .bak: start empty


# --- managers ---------------------------------------------------------------------------------------


def test_topic_config_manager_put_get_delete_persist(tmp_path: Path) -> None:
    mgr = TopicConfigManager(tmp_path)
    assert mgr.get("T") is None
    v0 = mgr.data_version.counter
    assert (
        mgr.put(TopicConfig("T", read_queue_nums=8, write_queue_nums=8, attributes={"queue.type": "BatchCQ"}))
        is None
    )
    assert mgr.data_version.counter == v0 + 1
    assert Path(mgr.config_file_path()).exists()  # persisted on change
    old = mgr.put(TopicConfig("T", perm=4))
    assert old is not None and old.read_queue_nums == 8
    assert mgr.data_version.counter == v0 + 2
    mgr.put(TopicConfig("%RETRY%GID_demo", read_queue_nums=1, write_queue_nums=1))
    assert [c.topic_name for c in mgr.list()] == ["T", "%RETRY%GID_demo"]
    assert "T" in mgr and len(mgr) == 2

    got = mgr.get("T")
    assert got is not None
    got.perm = 0  # a copy: the table is unchanged
    assert mgr.get("T").perm == 4  # type: ignore[union-attr]

    reloaded = TopicConfigManager(tmp_path)
    assert reloaded.load()
    assert reloaded.get("T") == TopicConfig("T", perm=4)
    assert reloaded.data_version == mgr.data_version
    assert reloaded.encode() == mgr.encode()

    assert mgr.delete("nope") is None
    assert mgr.data_version.counter == v0 + 3
    assert mgr.delete("T") is not None
    assert mgr.data_version.counter == v0 + 4
    reloaded = TopicConfigManager(tmp_path)
    reloaded.load()
    assert reloaded.get("T") is None and reloaded.get("%RETRY%GID_demo") is not None


@pytest.mark.parametrize("bad", ["../x", "a/b", "..", "", "T" * 128])
def test_topic_config_manager_refuses_bad_names(tmp_path: Path, bad: str) -> None:
    mgr = TopicConfigManager(tmp_path)
    with pytest.raises(TopicValidationError):
        mgr.put(TopicConfig(bad))
    assert len(mgr) == 0 and not Path(mgr.config_file_path()).exists()


def test_topic_config_manager_reads_spec_example(tmp_path: Path) -> None:
    _write(tmp_path / "topics.json", TOPICS_JSON)
    mgr = TopicConfigManager(tmp_path)
    assert mgr.load()
    assert mgr.get("TopicTest") == TopicConfig("TopicTest", read_queue_nums=4, write_queue_nums=4)
    assert mgr.data_version == DataVersion(2, 0, TS)
    assert mgr.encode() == TOPICS_JSON


def test_topic_config_manager_reads_4x_file(tmp_path: Path) -> None:
    text_4x = (
        '{\n\t"dataVersion":{\n\t\t"counter":7,\n\t\t"timestamp":1600000000000\n\t},\n'
        '\t"topicConfigTable":{\n\t\t"TopicTest":{\n\t\t\t"order":false,\n\t\t\t"perm":6,\n'
        '\t\t\t"readQueueNums":4,\n\t\t\t"topicFilterType":"SINGLE_TAG",\n\t\t\t"topicName":"TopicTest",\n'
        '\t\t\t"topicSysFlag":0,\n\t\t\t"writeQueueNums":4,\n\t\t\t"someFutureField":{"x":[1]}\n\t\t}\n\t},\n'
        '\t"unknownTopLevel":123\n}'
    )
    _write(tmp_path / "topics.json", text_4x)
    mgr = TopicConfigManager(tmp_path)
    assert mgr.load()
    assert mgr.get("TopicTest") == TopicConfig("TopicTest", read_queue_nums=4, write_queue_nums=4)
    assert mgr.data_version == DataVersion(7, 0, 1600000000000)


def test_consumer_offset_manager(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path, update_version_step=3)
    assert mgr.query_offset("G", "T", 0) == -1
    mgr.commit_offset("G", "T", 0, 10)
    mgr.commit_offset("G", "T", 1, 11)
    assert mgr.data_version.counter == 0
    mgr.commit_offset("G", "T", 0, 12)
    assert mgr.data_version.counter == 1  # bumped every `update_version_step` commits
    assert mgr.query_offset("G", "T", 0) == 12
    assert mgr.query_offset("G", "T", 5) == -1
    assert mgr.query_offset("H", "T", 0) == -1
    assert mgr.query_offsets("G", "T") == {0: 12, 1: 11}
    assert mgr.offset_table() == {"T@G": {0: 12, 1: 11}}
    assert not Path(mgr.config_file_path()).exists()  # persist is explicit
    mgr.persist()

    reloaded = ConsumerOffsetManager(tmp_path)
    assert reloaded.load()
    assert reloaded.offset_table() == {"T@G": {0: 12, 1: 11}}
    assert reloaded.data_version == mgr.data_version
    assert reloaded.which_topic_by_consumer("G") == {"T"}
    assert reloaded.which_group_by_topic("T") == {"G"}
    reloaded.remove_offset("G")
    assert reloaded.offset_table() == {}

    with pytest.raises(TopicValidationError):
        mgr.commit_offset("G@x", "T", 0, 1)
    with pytest.raises(TopicValidationError):
        mgr.commit_offset("G", "../T", 0, 1)
    # names are checked once per pair: a pair spelled with the separator never finds a checked pair's key
    mgr.commit_offset("G", "T", 0, 13)
    for group, topic in (("G", "T@G"), ("T@G", "T"), ("@G", "T"), ("G", "T@")):
        with pytest.raises(TopicValidationError):
            mgr.commit_offset(group, topic, 0, 1)


def test_consumer_offset_reads_spec_example_and_ignores_group_topic_map(tmp_path: Path) -> None:
    text = CONSUMER_OFFSET_JSON.replace('"GID_demo":["TopicTest"', '"GID_demo":["Bogus","TopicTest"')
    _write(tmp_path / "consumerOffset.json", text)
    mgr = ConsumerOffsetManager(tmp_path)
    assert mgr.load()
    assert mgr.offset_table() == {
        "TopicTest@GID_demo": {0: 120, 1: 118, 2: 119, 3: 121},
        "%RETRY%GID_demo@GID_demo": {0: 0},
    }
    assert mgr.query_offset("GID_demo", "TopicTest", 3) == 121
    assert mgr.encode() == CONSUMER_OFFSET_JSON  # groupTopicMap recomputed, not read back


def test_consumer_offset_reads_4x_file_and_quoted_keys(tmp_path: Path) -> None:
    text_4x = (
        '{\n\t"offsetTable":{\n\t\t"TopicTest@please_rename_unique_group_name_4":{0:250,1:249,2:250,3:251\n'
        '\t\t},\n\t\t"%RETRY%please_rename_unique_group_name_4@please_rename_unique_group_name_4":{0:0\n'
        "\t\t}\n\t}\n}"
    )
    _write(tmp_path / "consumerOffset.json", text_4x)
    mgr = ConsumerOffsetManager(tmp_path)
    assert mgr.load()
    assert mgr.query_offset("please_rename_unique_group_name_4", "TopicTest", 3) == 251
    assert mgr.data_version.counter == 0 and mgr.data_version.state_version == 0

    _write(tmp_path / "consumerOffset.json", '{"offsetTable":{"T@G":{"0":5,"1":"6"}}}')
    assert mgr.load()
    assert mgr.offset_table() == {"T@G": {0: 5, 1: 6}}


def test_consumer_offset_bad_content_falls_back_to_bak(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path)
    mgr.commit_offset("G", "T", 0, 1)
    mgr.persist()
    mgr.commit_offset("G", "T", 0, 2)
    mgr.persist()
    _write(tmp_path / "consumerOffset.json", '{"offsetTable":{"T@G":{"x":1}}}')  # decodes badly
    reloaded = ConsumerOffsetManager(tmp_path)
    assert reloaded.load()
    assert reloaded.query_offset("G", "T", 0) == 1  # from .bak (the previous content)


def test_subscription_group_manager(tmp_path: Path) -> None:
    mgr = SubscriptionGroupManager(tmp_path)
    cfg = SubscriptionGroupConfig(
        "GID_x",
        consume_message_orderly=True,
        retry_max_times=3,
        group_retry_policy={
            "type": "EXPONENTIAL",
            "exponentialRetryPolicy": {"multiplier": 2, "initial": 1000},
        },
        subscription_data_set=[{"topic": "T", "expressionType": "TAG", "expression": "*"}],
        attributes={"k": "v"},
    )
    mgr.put(cfg)
    assert Path(mgr.config_file_path()).exists()
    text = mgr.encode()
    assert '\t\t\t"groupRetryPolicy":{\n\t\t\t\t"exponentialRetryPolicy":{\n\t\t\t\t\t"initial":1000,' in text
    assert '"subscriptionDataSet":[{\n\t\t\t\t"expression":"*",' in text
    mgr.update_forbidden("GID_x", "T", 1, True)
    assert mgr.get_forbidden("GID_x", "T") == 2
    assert '"forbiddenTable":{\n\t\t"GID_x":{\n\t\t\t"T":2\n\t\t}\n\t}' in mgr.encode()

    reloaded = SubscriptionGroupManager(tmp_path)
    assert reloaded.load()
    assert reloaded.get("GID_x") == cfg
    assert reloaded.forbidden_table() == {"GID_x": {"T": 2}}
    assert reloaded.encode() == mgr.encode()

    mgr.update_forbidden("GID_x", "T", 1, False)
    assert mgr.forbidden_table() == {}
    assert mgr.delete("GID_x") == cfg
    assert mgr.list() == []
    with pytest.raises(TopicValidationError):
        mgr.put(SubscriptionGroupConfig("bad/group"))


def test_subscription_group_reads_spec_example_and_4x(tmp_path: Path) -> None:
    _write(tmp_path / "subscriptionGroup.json", SUBSCRIPTION_GROUP_JSON)
    mgr = SubscriptionGroupManager(tmp_path)
    assert mgr.load()
    assert mgr.get("GID_demo") == SubscriptionGroupConfig("GID_demo")
    assert mgr.encode() == SUBSCRIPTION_GROUP_JSON

    text_4x = (
        '{\n\t"dataVersion":{\n\t\t"counter":3,\n\t\t"timestamp":1600000000000\n\t},\n'
        '\t"subscriptionGroupTable":{\n\t\t"GID_old":{\n\t\t\t"brokerId":0,\n'
        '\t\t\t"consumeBroadcastEnable":true,\n\t\t\t"consumeEnable":false,\n'
        '\t\t\t"consumeFromMinEnable":true,\n\t\t\t"consumeMessageOrderly":false,\n'
        '\t\t\t"groupName":"GID_old",\n\t\t\t"notifyConsumerIdsChangedEnable":true,\n'
        '\t\t\t"retryMaxTimes":5,\n\t\t\t"retryQueueNums":1,\n\t\t\t"whichBrokerWhenConsumeSlowly":1\n'
        "\t\t}\n\t}\n}"
    )
    _write(tmp_path / "old" / "subscriptionGroup.json", text_4x)
    old = SubscriptionGroupManager(tmp_path / "old")
    assert old.load()
    assert old.get("GID_old") == SubscriptionGroupConfig("GID_old", consume_enable=False, retry_max_times=5)
    assert old.data_version == DataVersion(3, 0, 1600000000000)


def test_delay_offset_manager(tmp_path: Path) -> None:
    _write(tmp_path / "delayOffset.json", DELAY_OFFSET_JSON)
    mgr = DelayOffsetManager(tmp_path)
    assert mgr.load()
    assert mgr.offset_table() == {1: 5, 3: 2}
    assert mgr.query_offset(1) == 5 and mgr.query_offset(2) == -1
    assert mgr.encode() == DELAY_OFFSET_JSON
    mgr.update_offset(2, 9)
    mgr.persist()
    reloaded = DelayOffsetManager(tmp_path)
    assert reloaded.load() and reloaded.offset_table() == {1: 5, 3: 2, 2: 9}

    _write(tmp_path / "v4" / "delayOffset.json", '{"offsetTable":{1:5,"2":7}}')  # 4.x: no dataVersion
    v4 = DelayOffsetManager(tmp_path / "v4")
    assert v4.load() and v4.offset_table() == {1: 5, 2: 7}


def test_data_version_next_version() -> None:
    dv = DataVersion(counter=5, state_version=3, timestamp=1)
    before = int(time.time() * 1000)
    dv.next_version()
    assert dv.counter == 6 and dv.state_version == 0 and dv.timestamp >= before
    dv.next_version(state_version=9)
    assert dv.counter == 7 and dv.state_version == 9
    assert DataVersion.from_dict({"counter": 1, "timestamp": 2}) == DataVersion(1, 0, 2)


def test_concurrent_commits_and_persists(tmp_path: Path) -> None:
    mgr = ConsumerOffsetManager(tmp_path)
    stop = threading.Event()
    errors: list[BaseException] = []

    def committer(n: int) -> None:
        try:
            for i in range(2000):
                mgr.commit_offset(f"G{n}", "T", i % 8, i)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    def persister() -> None:
        try:
            while not stop.is_set():
                mgr.persist()
        except BaseException as exc:  # pragma: no cover
            errors.append(exc)

    threads = [threading.Thread(target=committer, args=(n,)) for n in range(4)]
    writers = [threading.Thread(target=persister) for _ in range(2)]
    for t in threads + writers:
        t.start()
    for t in threads:
        t.join()
    stop.set()
    for t in writers:
        t.join()
    assert not errors
    mgr.persist()
    reloaded = ConsumerOffsetManager(tmp_path)
    assert reloaded.load()
    assert reloaded.offset_table() == mgr.offset_table()
    assert all(reloaded.query_offset(f"G{n}", "T", 7) == 1999 for n in range(4))


# --- crash safety -----------------------------------------------------------------------------------


def _groups_in_round(round_no: int) -> int:
    return 1500 + (round_no * 37) % 1000  # ~110-190 kB of JSON, a different size every round


class _BlobManager(ConfigManager):
    """Persists whatever text it is given: keeps the child's time in the write path, not in encoding."""

    def __init__(self, config_dir: str) -> None:
        super().__init__()
        self.path = os.path.join(config_dir, "consumerOffset.json")
        self.text = ""

    def config_file_path(self) -> str:
        return self.path

    def encode(self, pretty: bool = True) -> str:
        return self.text

    def decode(self, text: str) -> None:  # pragma: no cover - write-only
        self.text = text


def _offsets_text(round_no: int) -> str:
    """consumerOffset.json content for one round (same layout as ConsumerOffsetManager writes)."""
    r = round_no
    entries = ",\n".join(
        f'\t\t"TopicCrash@GID_{g}":{{0:{r},1:{r},2:{r},3:{r}\n\t\t}}' for g in range(_groups_in_round(r))
    )
    version = f'\t"dataVersion":{{\n\t\t"counter":{r},\n\t\t"stateVersion":0,\n\t\t"timestamp":{TS}\n\t}},\n'
    return "{\n" + version + '\t"offsetTable":{\n' + entries + "\n\t}\n}"


def _persist_forever(config_dir: str, round_no: int, ready: Any) -> None:
    """Child process: persist ever-changing content (round r: every offset == r) until SIGKILLed."""
    mgr = _BlobManager(config_dir)
    while True:
        mgr.text = _offsets_text(round_no)
        mgr.persist()
        ready.set()
        round_no += 1


def _check_content(text: str) -> int:
    """Validate one file's content: complete, parseable, internally consistent. Returns its round."""
    doc = fastjson_loads(text)
    table = doc["offsetTable"]
    offsets = {offset for queues in table.values() for offset in queues.values()}
    assert len(offsets) == 1, "mixed rounds in one file"
    round_no = offsets.pop()
    assert len(table) == _groups_in_round(round_no), "wrong number of entries: truncated content"
    assert all(len(queues) == 4 for queues in table.values())
    assert doc["dataVersion"]["counter"] == round_no
    return round_no


def test_crash_safety_sigkill_during_persist(tmp_path: Path) -> None:
    """A child persisting big, changing content is SIGKILLed at random instants (35 rounds); each time the
    file (and its .bak) must hold one complete version, the newest or an older one, never a torn one."""
    ctx = multiprocessing.get_context("forkserver")  # fork would copy locks held by the threads other tests left in this process
    config_dir = tmp_path / "config"
    path = config_dir / "consumerOffset.json"
    rng = random.Random(20240601)
    last_round = -1
    for attempt in range(35):
        start_round = last_round + 1
        ready = ctx.Event()
        child = ctx.Process(target=_persist_forever, args=(str(config_dir), start_round, ready), daemon=True)
        child.start()
        try:
            assert ready.wait(60), f"child never persisted (attempt {attempt})"
            time.sleep(rng.uniform(0.0, 0.12))
        finally:
            assert child.pid is not None
            os.kill(child.pid, signal.SIGKILL)
            child.join()
        assert child.exitcode == -signal.SIGKILL

        # The main file itself is complete (not merely rescued by the .bak fallback) ...
        round_no = _check_content(path.read_text(encoding="utf-8"))
        # ... and read_config_file returns it without raising.
        assert read_config_file(path) == path.read_text(encoding="utf-8")
        assert round_no >= start_round, "a persisted round went missing"
        # The backup is replaced atomically too: if present it is complete and not newer.
        bak = Path(str(path) + ".bak")
        if bak.exists():
            assert _check_content(bak.read_text(encoding="utf-8")) <= round_no
        mgr = ConsumerOffsetManager(config_dir)
        assert mgr.load()
        assert mgr.query_offset("GID_0", "TopicCrash", 0) == round_no
        last_round = round_no
