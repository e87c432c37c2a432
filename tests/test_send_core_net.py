"""THE SEND CORE (issue "speed", branch send-core2): `_native.append_one_net` writes its one record straight
into the file and builds its request itself (`sc_append_net`, no `encode_network_run` batch), and parses a
born host once per str object (a one-entry cache keyed by the str and the `parse_host` function). Against
the pure-Python reference `CommitLog._append_one_net_py`, put by put (record bytes, write position, store
time, queue table, the request handed to `on_appended`, the result; a decline changing nothing): messages
drawn by Hypothesis over born hosts (v4, v6, v4-mapped v6, unparsable, the same str object again and equal
texts in new objects), flags, sys flags, tags and keys (non-ASCII too, named twice, empty, named inside
values), reconsume times, prepared offsets, bodies below and above the folded CRC's 64 bytes, with and
without the CRC trailer. Also: the born host cache follows the netctx's `parse_host`."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from tests.single_put_helpers import compare_single_puts, store_pair
from tests.single_put_helpers import native as _native

_HOSTS = ("10.0.0.1:9", "[::1]:10911", "[::ffff:10.1.2.3]:7", "127.0.0.1:4294967295", "no-port", "[::1]x:1",
          "1.2.3.4:99999999999", "")
_SHARED = {h: h for h in _HOSTS}  # one str object per text, put again and again (the cache's hit)


@st.composite
def _message(draw: st.DrawFn) -> Message:
    i = draw(st.integers(0, 10_000))
    host = draw(st.sampled_from(_HOSTS))
    if draw(st.booleans()):
        host = "".join(list(host))  # an equal text in a new object (the cache's miss)
    else:
        host = _SHARED[host]
    props = ""
    tags = draw(st.sampled_from([None, "tagA", "t\u00e9g", "\u4e2d"]))
    if tags is not None:
        props += f"TAGS\x01{tags}\x02"
    if draw(st.booleans()):
        props += f"KEYS\x01k{i} \u00fc{i % 3}\x02"
    props += f"UNIQ_KEY\x01{i:032X}\x02CLUSTER\x01DefaultCluster"
    # a property twice (the last counts), an empty value, names inside values, a trailer already there
    props = draw(st.sampled_from(["", "TAGS\x01old\x02KEYS\x01o1\x02UNIQ_KEY\x01EE\x02", "TAGS\x01\x02", "KEYS\x01\x02",
                                  "UNIQ_KEY\x01\x02", "xTAGS\x01no\x02", "A\x01TAGS\x01KEYS\x01\x02", "__CRC32#\x010\x02"])) + props
    if draw(st.booleans()):
        props += "\x02"
    m = Message(topic=draw(st.sampled_from(["TopicA", "%RETRY%g-1"])), body=bytes([i % 251]) * draw(st.integers(0, 900)),
                queue_id=draw(st.integers(0, 2)), properties_string=props,
                born_timestamp=draw(st.sampled_from([0, 1_700_000_000_000 + i])), born_host=host or None,
                flag=draw(st.integers(-(2 ** 31), 2 ** 31 - 1)), reconsume_times=draw(st.integers(0, 16)))
    m.sys_flag = draw(st.sampled_from([0, 1, codec.TRANSACTION_PREPARED_TYPE, codec.TRANSACTION_COMMIT_TYPE, 0x30]))
    m.prepared_transaction_offset = draw(st.sampled_from([0, 12345, 2 ** 62]))
    return m


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(msgs=st.lists(_message(), min_size=20, max_size=80), append_crc=st.booleans())
def test_append_one_net_equals_the_reference_over_drawn_messages(msgs: list[Message], append_crc: bool) -> None:
    """Put by put, the native network single put equals its reference, declines included."""
    with tempfile.TemporaryDirectory() as d, \
            store_pair(Path(d), auto_create_uniq_key=False, enabled_append_prop_crc=append_crc) as (a, b):
        for s in (a, b):  # the queues exist (else both decline every first put of a queue)
            for topic in ("TopicA", "%RETRY%g-1"):
                for q in range(3):
                    assert s.put_message(Message(topic=topic, body=b"x", queue_id=q, properties_string="")).is_ok()
        puts = compare_single_puts(
            a, b, msgs,
            lambda cl, m: _native.append_one_net(cl, m, cl.encoder.network_context(), cl.file_size),
            lambda cl, m: cl._append_one_net_py(m))
        assert len(puts) == len(msgs)


def test_the_born_host_cache_follows_parse_host(tmp_path: Path) -> None:
    """The same born host str put with a netctx whose parse_host differs is parsed by that function (the
    cache is keyed by the function too), and the real one's answer comes back after."""
    host = "".join(["10.0.0.", "1:9"])
    with store_pair(tmp_path, auto_create_uniq_key=False) as (a, _b):
        cl = a.commit_log
        assert a.put_message(Message(topic="TopicA", body=b"x", queue_id=0, properties_string="")).is_ok()
        ctx = cl.encoder.network_context()
        other = (*ctx[:8], lambda h: (b"\x0a\x0b\x0c\x0d", 77), *ctx[9:])
        seen = []
        for netctx in (ctx, other, other, ctx):
            m = Message(topic="TopicA", body=b"y", queue_id=0, properties_string="UNIQ_KEY\x01AB\x02", born_host=host)
            with cl.put_lock:
                r = _native.append_one_net(cl, m, netctx, cl.file_size)
            assert r is not None and r.is_ok()
            got = codec.decode_message(cl.read_record(r.append_result.wrote_offset), 0)
            seen.append((got.born_host_bytes, got.born_port))
        assert seen == [(b"\x0a\x00\x00\x01", 9), (b"\x0a\x0b\x0c\x0d", 77), (b"\x0a\x0b\x0c\x0d", 77),
                        (b"\x0a\x00\x00\x01", 9)]
