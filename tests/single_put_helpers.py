"""What the single put's tests share (tests/test_single_put.py: `_native.append_one`, and
tests/test_single_put_net.py: `_native.append_one_net`): the extension set up for the single put, the
small store geometry, a pair of stores, the put-by-put comparison of a native single put with its Python
reference, and a whole store's records, consume queue files and index answers after single puts."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message
from rmq_eventstore.common.status import AppendMessageStatus, PutMessageStatus
from rmq_eventstore.store import MessageStore
from rmq_eventstore.store import commitlog as commitlog_module
from rmq_eventstore.store.commitlog import AppendMessageResult, CommitLog, PutMessageResult
from tests.conftest import import_native

native = import_native()  # skips the importing test module when the extension is not built
native.init(Message)
native.single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK, PutMessageStatus.PUT_OK)

GEOMETRY = {"mapped_file_size_commit_log": 16 * 1024, "mapped_file_size_consume_queue": 20 * 100,
            "max_hash_slot_num": 64, "max_index_num": 300}

# a record's fields the comparisons read: all but the store time and the born time (the net test adds the
# latter); the properties string last, so a test can rewrite it at row[-1]
FIELDS = ("store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
          "sys_flag", "born_host_bytes", "born_port", "store_host_bytes", "store_port", "reconsume_times",
          "prepared_transaction_offset", "body", "topic", "properties_string")


def open_store(path: Path, **config: Any) -> MessageStore:
    """A store of the small geometry (16 KiB commitlog files: the puts roll files)."""
    return MessageStore.open(path, **GEOMETRY, **config)


@contextlib.contextmanager
def store_pair(tmp_path: Path, **config: Any) -> Iterator[tuple[MessageStore, MessageStore]]:
    """Two stores alike, `native` and `ref` under tmp_path, shut down on the way out."""
    a, b = open_store(tmp_path / "native", **config), open_store(tmp_path / "ref", **config)
    try:
        yield a, b
    finally:
        a.shutdown()
        b.shutdown()


@contextlib.contextmanager
def store_clock(ts: int) -> Iterator[None]:
    """The commit log's clock (`commitlog.now_ms`) stopped at ts: a reference put stamps what the native
    one stamped."""
    real = commitlog_module.now_ms
    commitlog_module.now_ms = lambda: ts
    try:
        yield
    finally:
        commitlog_module.now_ms = real


def _put_state(cl: CommitLog) -> tuple:
    mfs = cl.mapped_file_queue.mapped_files
    return dict(cl.topic_queue_table), len(mfs), mfs[-1].wrote_position if mfs else -1


def compare_single_puts(a: MessageStore, b: MessageStore, msgs: Iterable[Message],
                        native_put: Callable[[CommitLog, Message], PutMessageResult | None],
                        ref_put: Callable[[CommitLog, Message], tuple | None]) -> list[tuple | None]:
    """Put by put, `native_put(commit_log, msg)` (under the put lock) on store a against `ref_put` on store
    b at the same store time: the same record bytes, write position, store timestamp, queue table and
    request handed to `on_appended`, and a result equal to the one `_append_one` builds from the reference's
    tuple. A declined put (None) changed nothing, the reference declines it too, and then the general path
    takes it in both stores alike. Returns, message by message, None (declined) or (result, request)."""
    handed: dict[str, list] = {"native": [], "ref": []}
    for name, s in (("native", a), ("ref", b)):
        s.commit_log.on_appended = lambda start, end, reqs, name=name: handed[name].append((start, end, reqs))
    out: list[tuple | None] = []
    cla, clb = a.commit_log, b.commit_log
    for i, m in enumerate(msgs):
        before = _put_state(cla)
        with cla.put_lock:
            res = native_put(cla, m)
        if res is None:
            assert _put_state(cla) == before and cla.begin_time_in_lock == 0, i
            with store_clock(1_700_000_000_000):
                assert ref_put(clb, m) is None, i
            ra = a.put_message(m)  # the general path takes it, in both stores alike
            with store_clock(ra.append_result.store_timestamp if ra.append_result else 0):
                rb = b.put_message(m)
            assert ra.status == rb.status, (i, ra, rb)
            out.append(None)
            continue
        ap = res.append_result
        with store_clock(ap.store_timestamp):
            ref = ref_put(clb, m)
        assert ref is not None, i
        base, total, begin, q, req = ref
        expect = PutMessageResult(PutMessageStatus.PUT_OK, AppendMessageResult(
            AppendMessageStatus.PUT_OK, base, total, begin, q, 1, ap.page_cache_rt, clb.store_host_bytes,
            clb.store_port, [base], [req.uniq_key]))
        assert res == expect and res.status is PutMessageStatus.PUT_OK and res.reason == ""
        assert res.is_ok() and res.append_result.msg_id == expect.append_result.msg_id
        assert handed["native"][-1] == handed["ref"][-1] == (base, base + total, (req,))
        mfa, mfb = cla.mapped_file_queue.mapped_files[-1], clb.mapped_file_queue.mapped_files[-1]
        pos = base - mfa.file_from_offset
        assert bytes(mfa.view[pos:pos + total]) == bytes(mfb.view[pos:pos + total])
        assert (mfa.wrote_position, mfa.store_timestamp) == (mfb.wrote_position, mfb.store_timestamp)
        assert cla.topic_queue_table == clb.topic_queue_table
        assert cla.begin_time_in_lock == clb.begin_time_in_lock == 0
        out.append((res, req))
    return out


def tree(root: Path, sub: str) -> dict[str, bytes]:
    """The files under root/sub, by their path below it."""
    base = root / sub
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def put_and_read(root: Path, msgs: list[Message], row: Callable[[Message], tuple], keys: Iterable[str],
                 topics: Iterable[str], check: Callable[[int, Message, PutMessageResult], None] | None = None,
                 **config: Any) -> tuple[list[tuple], dict[str, bytes], dict[tuple[str, str], list[int]]]:
    """A store at root fed `msgs` by single puts through `put_message` (each ok, one offset; `check` sees
    each), then, once dispatched: its records as `row(decoded message)`, its consume queue files, and the
    queue offsets the index finds for each of `keys` in each of `topics` (where it finds any)."""
    s = open_store(root, **config)
    for i, m in enumerate(msgs):
        r = s.put_message(m)
        assert r.is_ok(), (i, r)
        assert r.append_result.offsets == [r.append_result.wrote_offset]
        if check is not None:
            check(i, m, r)
    assert s.wait_for_dispatch(10)
    records, off = [], s.commit_log.get_min_offset()
    while off < s.commit_log.get_max_offset():
        buf = s.commit_log.get_message(off, 8)
        if buf is None or codec._INT.unpack_from(buf, 4)[0] == codec.BLANK_MAGIC_CODE:  # a file's end
            off = s.commit_log.roll_next_file(off)
            continue
        m = codec.decode_message(s.commit_log.read_record(off), 0)
        records.append(row(m))
        off += m.store_size
    found_at = {}
    topics = tuple(topics)
    for k in keys:
        for topic in topics:
            found = s.query_message(topic, k, 64, 0, 2 ** 62)
            got = sorted(x.queue_offset for x in found.messages) if found is not None else []
            if got:
                found_at[(topic, k)] = got
    s.shutdown()
    return records, tree(root, "consumequeue"), found_at
