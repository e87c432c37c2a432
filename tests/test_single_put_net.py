"""The network single put (issue 16, branch send-single): `_native.append_one_net`, the broker's
SEND_MESSAGE store of one message that carries a properties string, against its pure-Python reference
`CommitLog._append_one_net_py`, and whole stores fed such puts through the native path, the reference and
the general batch path (`_append_plain`), which must leave the same records, consume queues and index.
The functions are called directly, so the file also runs (and compares) under `RMQ_EVENTSTORE_PURE=1`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from rmq_eventstore.store import commitlog as commitlog_module
from rmq_eventstore.store.commitlog import CommitLog
from tests.single_put_helpers import FIELDS, compare_single_puts, put_and_read, store_pair
from tests.single_put_helpers import native as _native


def _messages(n: int) -> list[Message]:
    """Messages as the broker builds them from SEND_MESSAGE_V2 (a properties string with the broker's
    UNIQ_KEY and CLUSTER, a born host), of several sizes, queues, tags and keys; and a few the network
    path declines: a prepared transaction, an empty TAGS value, no properties string at all."""
    out = []
    for i in range(n):
        props = ""
        if i % 3:
            props += f"TAGS\x01tag{i % 4}\x02"
        if i % 7:
            props += f"KEYS\x01k{i} x{i % 3}\x02"
        props += f"WAIT\x01{'true' if i % 2 else 'false'}\x02UNIQ_KEY\x01{i:032X}\x02CLUSTER\x01DefaultCluster\x02"
        m = Message(topic="TopicA" if i % 5 else "%RETRY%g-1", body=bytes([i % 251]) * (i * 37 % 700),
                    queue_id=i % 3, properties_string=props, born_timestamp=1_700_000_000_000 + i,
                    born_host="10.0.0.1:9" if i % 4 else "[::1]:10911", flag=i % 5, reconsume_times=i % 2)
        if i % 29 == 28:
            m.sys_flag = codec.TRANSACTION_PREPARED_TYPE
        if i % 31 == 30:
            m.properties_string = "TAGS\x01\x02" + props
        if i % 37 == 36:
            m.properties_string = None
        out.append(m)
    return out


@pytest.mark.parametrize("append_crc", [False, True])
def test_append_one_net_equals_the_reference(tmp_path: Path, append_crc: bool) -> None:
    """Put by put, `_native.append_one_net` writes what `_append_one_net_py` writes at the same store time
    (record bytes, write position, store timestamp, queue table, the request handed to `on_appended`) and
    declines exactly what it declines (a new queue, no room before the file's end, a message the network
    encoder does not cover), changing nothing then; its result objects are those `_append_one` builds."""
    with store_pair(tmp_path, auto_create_uniq_key=False, enabled_append_prop_crc=append_crc) as (a, b):
        puts = compare_single_puts(
            a, b, _messages(400),
            lambda cl, m: _native.append_one_net(cl, m, cl.encoder.network_context(), cl.file_size),
            lambda cl, m: cl._append_one_net_py(m))
        assert all(p is None or p[1].uniq_key == f"{i:032X}" for i, p in enumerate(puts))
        declined = puts.count(None)
        assert 30 < declined < 200 and len(puts) - declined > 200  # new queues, file ends, the declined kinds
        assert len(a.commit_log.mapped_file_queue.mapped_files) > 3  # the files rolled


_FIELDS = ("born_timestamp", *FIELDS)  # the born time is the producer's here: it is compared too


@pytest.mark.parametrize("append_crc", [False, True])
def test_network_single_puts_native_reference_and_general_path_agree(tmp_path: Path, monkeypatch,
                                                                     append_crc: bool) -> None:
    """Whole stores fed the same single puts through `put_message`: natively (`append_one_net`), through
    the reference (`_append_one_net_py`) and through the general batch path only (`_append_plain`, what the
    broker's sends took before) leave the same records (all fields but the store time), the same
    consume-queue bytes and the same index answers, across file rolls and new queues."""
    msgs = _messages(300)

    keys = [k for i in range(len(msgs)) for k in (f"k{i}", f"x{i % 3}", f"{i:032X}")]

    def row(m: Message) -> tuple:
        r = [getattr(m, f) for f in _FIELDS]
        if append_crc:  # the trailer's CRC covers the store time: its digits are left out
            r[-1] = re.sub("__CRC32#\x01[0-9]{10}", "__CRC32#", r[-1])
        return tuple(r)

    def run(name: str) -> tuple[list, dict, dict]:
        return put_and_read(tmp_path / name, msgs, row, keys, ("TopicA", "%RETRY%g-1"),
                            enabled_append_prop_crc=append_crc, auto_create_uniq_key=False)

    native = run("native")
    monkeypatch.setattr(commitlog_module, "native_put_one", None)  # put_message's native path in one call
    monkeypatch.setattr(commitlog_module, "_native_append_one", None)
    monkeypatch.setattr(commitlog_module, "_native_append_one_net", None)
    ref = run("ref")
    monkeypatch.setattr(CommitLog, "_append_one", lambda self, msg, uniq: None)
    general = run("general")
    assert len(native[0]) == len(msgs)
    assert all(("__CRC32#" in r[-1]) == append_crc for r in native[0])
    for i, (x, y, z) in enumerate(zip(native[0], ref[0], general[0], strict=True)):
        assert x == y == z, (i, [(f, u, v, w) for f, u, v, w in zip(_FIELDS, x, y, z, strict=True) if not u == v == w and f != "body"])
    assert native[1] == ref[1] == general[1] and len(native[1]) > 3
    assert native[2] == ref[2] == general[2] and len(native[2]) > 100
