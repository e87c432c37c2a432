"""Robustness: thousands of malformed or hostile frames against a live broker. It must keep serving
other connections, answer what it can, close what it cannot decode, and store nothing bad."""

from __future__ import annotations

import json
import logging
import os
import random
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.common import codec
from rmq_eventstore.common.topic import is_valid_topic
from rmq_eventstore.remoting import FrameDecoder, RemotingCommand, RequestCode

SMALL = {"mapped_file_size_commit_log": 1024 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096, "max_frame_size": 1024 * 1024}
CODES = [int(c) for c in RequestCode] + [0, -1, 3, 999, 2**31 - 1, -(2**31)]
HOSTILE_TOPICS = ["orders", "../../escape", "a/b", "..", "", " ", "x" * 300, "%RETRY%g", "%DLQ%g", "SCHEDULE_TOPIC_XXXX",
                  "TBW102", "t\x00nul", "тема", "rmq_sys_x", "%RETRY%" + "g" * 250, "orders\n", "CON"]
HOSTILE_GROUPS = ["g", "../g", "", "g" * 300, "%RETRY%g", "cg\x00"]
HOSTILE_VALUES = ["", "0", "-1", "1", "2147483648", "-9223372036854775809", "99999999999999999999999",
                  "true", "false", "NaN", "1e9", "0x10", " 7", "\u00e9", "A" * 5000, 0, -1, 2**63, True, None, 1.5]
FIELDS = ["topic", "queueId", "queueOffset", "maxMsgNums", "sysFlag", "commitOffset", "suspendTimeoutMillis",
          "subscription", "consumerGroup", "group", "offset", "delayLevel", "key", "maxNum", "timestamp",
          "readQueueNums", "writeQueueNums", "perm", "clientID", "producerGroup", "a", "b", "c", "d", "e", "f", "g",
          "h", "i", "j", "k", "l", "m", "properties", "batch", "expressionType", "beginTimestamp", "endTimestamp"]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningBroker]:
    root = tmp_path_factory.mktemp("fuzz")
    rb = serve_in_thread(root / "store", **SMALL)
    yield rb
    rb.close()


def connect(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=5)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def healthy(rb: RunningBroker) -> None:
    """A well-behaved client still gets its send stored and pulled back, promptly."""
    s = connect(rb.broker_address)
    dec = FrameDecoder()

    def call(cmd: RemotingCommand) -> RemotingCommand:
        s.sendall(cmd.encode())
        while True:
            for r in dec.feed(s.recv(1 << 16)):
                if r.is_response and r.opaque == cmd.opaque:
                    return r

    body = b"healthy-%d" % random.getrandbits(32)
    r = call(RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "pg", "b": "health", "e": 0, "i": ""}, body))
    assert r.code == 0, r
    off = int(r.ext_fields["queueOffset"])
    r = call(RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "hc", "topic": "health", "queueId": 0, "queueOffset": off, "maxMsgNums": 1, "sysFlag": 6,
        "suspendTimeoutMillis": 3000, "subscription": "*"}))
    assert r.code == 0 and codec.decode_message(r.body).body == body
    s.close()


def frame(header: bytes, body: bytes = b"", stype: int = 0, length: int | None = None,
          hlen: int | None = None) -> bytes:
    n = 4 + len(header) + len(body) if length is None else length
    h = len(header) if hlen is None else hlen
    return struct.pack(">iI", n & 0xFFFFFFFF if n >= 0 else n, ((stype & 0xFF) << 24) | (h & 0xFFFFFF)) + header + body


def hostile_frame(rng: random.Random) -> bytes:
    kind = rng.random()
    if kind < 0.08:  # pure garbage
        return rng.randbytes(rng.randint(1, 64))
    if kind < 0.16:  # lying lengths
        header = b'{"code":10}'
        return frame(header, length=rng.choice([-1, 0, 3, 2**31 - 1, 10**7, rng.randint(0, 100)]),
                     hlen=rng.choice([0, 2**24 - 1, rng.randint(0, 200)]))
    if kind < 0.24:  # broken JSON / wrong shapes / unknown serialization types
        header = rng.choice([b"{", b"null", b"[]", b'"x"', b'{"code":"10"}', b'{"code":1.5}', b'{"code":10,"extFields":1}',
                             b'{"code":10,"extFields":{"topic":{"a":1}}}', b"\xff\xfe\x00", b'{"code":' + b"9" * 400 + b"}",
                             b"[" * 5000 + b"]" * 5000])
        return frame(header, stype=rng.choice([0, 0, 1, 2, 255]))
    ext = {}
    for _ in range(rng.randint(0, 10)):
        name = rng.choice(FIELDS)
        if name in ("topic", "b"):
            ext[name] = rng.choice(HOSTILE_TOPICS)
        elif name in ("consumerGroup", "group", "a", "producerGroup"):
            ext[name] = rng.choice(HOSTILE_GROUPS)
        else:
            ext[name] = rng.choice(HOSTILE_VALUES)
    code = rng.choice(CODES)
    body = rng.choice([b"", rng.randbytes(rng.randint(0, 300)), b"{}", b'{"clientID":"x","consumerDataSet":[1,{}]}\n',
                       codec.encode_batch_body([(b"x", 0, "KEYS\x01k\x02")]), b"\x00\x00\x00\x16" + b"\x00" * 18])
    header = json.dumps({"code": code, "opaque": rng.randint(-(2**31), 2**31 - 1), "flag": rng.choice([0, 0, 1, 2, 3]),
                         "language": rng.choice(["JAVA", 1, "PYTHON"]), "extFields": ext}).encode()
    return frame(header, body)


def test_thousands_of_hostile_frames(broker: RunningBroker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    rng = random.Random(20261122)
    root = broker.store.config.store_path_root_dir
    before = set(os.listdir(os.path.dirname(root)))
    sent = 0
    deadline = time.monotonic() + 6.0
    conns: list[socket.socket] = []
    while sent < 10_000 and time.monotonic() < deadline:
        s = connect(broker.broker_address)
        conns.append(s)
        for _ in range(rng.randint(1, 60)):
            try:
                s.sendall(hostile_frame(rng))
            except OSError:  # the broker closed this connection after a malformed frame: expected
                break
            sent += 1
        s.setblocking(False)
        try:
            while s.recv(1 << 20):
                pass
        except (BlockingIOError, OSError):
            pass
        if len(conns) > 20:
            conns.pop(0).close()
        if sent // 500 != (sent - 1) // 500:
            healthy(broker)
    for s in conns:
        s.close()
    print(f"sent {sent} hostile frames over {len(conns)}+ connections")
    assert sent >= 1000
    healthy(broker)
    # nothing bad stored: only valid topic names became directories, nothing escaped the store root
    store = broker.store
    assert store.wait_for_dispatch(5)
    for topic in os.listdir(os.path.join(root, "consumequeue")):
        assert is_valid_topic(topic), topic
    assert set(os.listdir(os.path.dirname(root))) == before
    for name in ("escape", "a"):
        assert not os.path.exists(os.path.join(root, name))
    for tc in store.topic_config_manager.list():
        assert is_valid_topic(tc.topic_name)
    # every stored record decodes and belongs to a valid topic
    offset = store.get_min_phy_offset()
    end = store.get_max_phy_offset()
    count = 0
    while offset < end:
        buf = store.select_one_message_by_offset(offset)
        if buf is None:  # BLANK at the end of a segment: go to the next one
            offset = store.commit_log.roll_next_file(offset)
            continue
        m = codec.decode_message(buf, 0, check_crc=True)
        assert is_valid_topic(m.topic)
        offset += m.store_size
        count += 1
    assert count >= 1
    # malformed frames were logged as such; no handler blew up with an unexpected exception
    assert any("malformed frame" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("rmq_eventstore.broker")]


_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.text(max_size=40))
_json = st.recursive(_json_scalar, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=20)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(code=st.sampled_from(CODES), ext=st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), _json,
                                                       max_size=8), body=st.binary(max_size=256))
def test_any_header_shape_gets_an_answer_or_a_close(broker: RunningBroker, code: int, ext: dict, body: bytes) -> None:
    s = connect(broker.broker_address)
    try:
        header = json.dumps({"code": code, "opaque": 77, "flag": 0, "extFields": ext}).encode()
        s.sendall(frame(header, body))
        s.settimeout(5)
        dec = FrameDecoder()
        while True:
            data = s.recv(1 << 16)
            if not data:  # closed: only for a header that is not a remoting header
                assert not all(isinstance(v, (str, int, float, bool, type(None))) for v in ext.values()) or any(
                    isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))) for v in ext.values())
                return
            out = dec.feed(data)
            if out:
                r = out[0]
                assert r.is_response and r.opaque == 77
                return
    except TimeoutError:
        # only a pull may be held (suspended) instead of answered
        assert code == RequestCode.PULL_MESSAGE
    finally:
        s.close()
