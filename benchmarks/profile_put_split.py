"""Where a batched put with dispatch spends its time, phase by phase, measured apart (no sampling).

    python benchmarks/profile_put_split.py [--n 200000] [--batch 1000 | --single] [--reps 3]

The workload of `bench_store.py` (200-byte bodies, one 14-character key, 4 queues of one topic, a UNIQ_KEY
added by the store) is put into a fresh store whose reput thread is NOT started: each phase is timed on its
own, single-threaded, in µs per message:

- uniq: `CommitLog._uniq_keys` (the UNIQ_KEY ids of a batch);
- encode: `RecordEncoder.encode_plain_batch` alone (the same batch, a copy of the queue table), with the
  columns hand-off the put asks for (`DispatchColumns`: units and index entries made while encoding);
- append: the rest of `CommitLog.put_messages` (lock, file, copy into the mmap, queue table, result);
- dispatch: `MessageStore._dispatch` of what the puts handed over, split into the consume-queue grouping
  loop, `ConsumeQueue.put_message_position_infos` and `IndexService.build_index` (of which the
  `index_key_hashes` hashing and `IndexFile.put_keys` insert are timed too; with the native core the
  keys are hashed while encoding (columns), so "index hashing" is 0 and "index keys" is the arrays only;
  "grouping loop" is then the rest of `_dispatch_columns`).

It prints which record codec is active (`codec.NATIVE`); run it with `RMQ_EVENTSTORE_PURE=1` for the
pure-Python one. The sum is what one core spends per message when nothing overlaps. Times are the
thread's CPU time (`time.thread_time`), which a loaded machine inflates much less than wall time.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rmq_eventstore.common import codec  # noqa: E402
from rmq_eventstore.store import Message, MessageStore, StoreConfig  # noqa: E402
from rmq_eventstore.store import consume_queue as cq_mod  # noqa: E402
from rmq_eventstore.store import index as index_mod  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 4
rng = random.Random(20261122)
BODIES = [rng.randbytes(200) for _ in range(1024)]


class Timer:
    """Accumulates the time spent inside a wrapped callable."""

    def __init__(self) -> None:
        self.total = 0.0

    def wrap(self, fn):
        def timed(*a, **kw):
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                self.total += time.thread_time() - t0
        return timed


def one_run(n: int, batch: int, root: Path) -> dict[str, float]:
    msgs = [Message(topic=TOPIC, body=BODIES[i & 1023], keys=f"p00-{i:010d}", queue_id=i % QUEUES)
            for i in range(n)]
    batches = [msgs[i:i + batch] for i in range(0, n, batch)]
    path = tempfile.mkdtemp(prefix="split-", dir=root)
    store = MessageStore(StoreConfig(store_path_root_dir=path))
    store.load()
    handed: list[list] = []
    cl = store.commit_log
    cl.on_appended = lambda start, end, reqs: handed.append(reqs)
    try:
        # uniq + encode alone, on a copy of the queue table (the real put below starts from the same state)
        enc = cl.encoder
        assert cl.put_messages(batches[0][:1]).is_ok()  # validates and encodes the topic once, as a first put does
        handed.clear()
        uniq_s = enc_s = 0.0
        table = dict(cl.topic_queue_table)
        for b in batches:
            t0 = time.thread_time()
            u = cl._uniq_keys(b)
            t1 = time.thread_time()
            res = enc.encode_plain_batch(b, u, table, 0, 1, True)  # what put_messages asks for (columns)
            t2 = time.thread_time()
            assert res is not None
            uniq_s += t1 - t0
            enc_s += t2 - t1
        # the whole put (uniq, encode, append), reput not running
        t0 = time.thread_time()
        for b in batches:
            r = cl.put_messages(b)
            assert r.is_ok(), r
        put_s = time.thread_time() - t0
        # dispatch, split by wrapping its parts
        cq_t, idx_t, hash_t, ins_t = Timer(), Timer(), Timer(), Timer()
        orig_cq = cq_mod.ConsumeQueue.put_message_position_infos
        orig_build = store.index_service.build_index
        orig_build_cols = store.index_service.build_index_columns
        orig_hash = index_mod.index_key_hashes
        orig_ins = index_mod.IndexFile.put_keys
        cq_mod.ConsumeQueue.put_message_position_infos = cq_t.wrap(orig_cq)
        store.index_service.build_index = idx_t.wrap(orig_build)
        store.index_service.build_index_columns = idx_t.wrap(orig_build_cols)
        index_mod.index_key_hashes = hash_t.wrap(orig_hash)
        index_mod.IndexFile.put_keys = ins_t.wrap(orig_ins)
        try:
            t0 = time.thread_time()
            for reqs in handed:
                store._dispatch(reqs)
            disp_s = time.thread_time() - t0
        finally:
            cq_mod.ConsumeQueue.put_message_position_infos = orig_cq
            index_mod.index_key_hashes = orig_hash
            index_mod.IndexFile.put_keys = orig_ins
        assert store.index_service.get_total_entries() == 2 * n
    finally:
        store.shutdown()
        shutil.rmtree(path, ignore_errors=True)
    us = 1e6 / n
    return {
        "uniq": uniq_s * us, "encode": enc_s * us, "append (rest of put)": (put_s - uniq_s - enc_s) * us,
        "put total": put_s * us,
        "dispatch: grouping loop": (disp_s - cq_t.total - idx_t.total) * us,
        "dispatch: consume-queue write": cq_t.total * us,
        "dispatch: index keys + arrays": (idx_t.total - hash_t.total - ins_t.total) * us,
        "dispatch: index hashing": hash_t.total * us,
        "dispatch: index insert": ins_t.total * us,
        "dispatch total": disp_s * us,
        "put + dispatch": (put_s + disp_s) * us,
    }


def one_run_single(n: int, root: Path) -> dict[str, float]:
    """`--single`: single puts (`MessageStore.put_message`) of the same workload, reput not running. Stages
    timed as separate loops of the same puts into fresh stores: the UNIQ_KEY alone, the locked append alone
    (`_native.append_one` under the put lock with the native core, else `_append_one_py`), the whole put
    (its Python around them is the difference), then the dispatch of what the puts handed over, taken as the
    reput takes it (`_take_pending` + `_dispatch`)."""
    from rmq_eventstore.store import commitlog as cl_mod

    msgs = [Message(topic=TOPIC, body=BODIES[i & 1023], keys=f"p00-{i:010d}", queue_id=i % QUEUES)
            for i in range(n)]

    def fresh() -> tuple[MessageStore, str]:
        path = tempfile.mkdtemp(prefix="split-", dir=root)
        st = MessageStore(StoreConfig(store_path_root_dir=path))
        st.load()
        st._started = True  # puts allowed; no service thread runs (the dispatch is timed below, alone)
        for m in msgs[:QUEUES]:
            assert st.put_message(m).is_ok()  # the queues exist: every put below takes the fast path
        return st, path

    out: dict[str, float] = {}
    us = 1e6 / n
    # the UNIQ_KEY alone (as put_message takes it)
    st, path = fresh()
    try:
        gen = st.commit_log.uniq_ids
        fast = cl_mod._native_uniq
        t0 = time.thread_time()
        for _ in range(n):
            (fast is not None and fast(gen)) or gen.create()
        out["uniq"] = (time.thread_time() - t0) * us
    finally:
        st.shutdown()
        shutil.rmtree(path, ignore_errors=True)
    # the locked append alone (record, queue table, hand-off, results)
    st, path = fresh()
    try:
        cl = st.commit_log
        cl.on_appended = st.reput_message_service.notify_appended
        ctx, size, lock = cl.encoder.plain_context(), cl.file_size, cl.put_lock
        native = cl_mod._native_append_one
        t0 = time.thread_time()
        if native is not None:
            for m in msgs:
                with lock:
                    native(cl, m, None, ctx, size)
        else:
            for m in msgs:
                cl._append_one_py(m, None)
        out["append (locked body + results)"] = (time.thread_time() - t0) * us
    finally:
        st.shutdown()
        shutil.rmtree(path, ignore_errors=True)
    # the whole put, then the dispatch of its hand-offs
    st, path = fresh()
    try:
        rs = st.reput_message_service
        rs.do_reput()
        put = st.put_message
        t0 = time.thread_time()
        for m in msgs:
            put(m)
        put_s = time.thread_time() - t0
        t0 = time.thread_time()
        while rs.do_reput():
            pass
        disp_s = time.thread_time() - t0
        assert st.index_service.get_total_entries() >= 2 * n
    finally:
        st.shutdown()
        shutil.rmtree(path, ignore_errors=True)
    out["put: the rest (Python, lock, wake-up)"] = put_s * us - out["uniq"] - out["append (locked body + results)"]
    out["put total"] = put_s * us
    out["dispatch total"] = disp_s * us
    out["put + dispatch"] = (put_s + disp_s) * us
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ap.add_argument("--single", action="store_true", help="single puts (put_message) instead of batches")
    args = ap.parse_args()
    root = REPO / "var" / "bench"
    root.mkdir(parents=True, exist_ok=True)
    if args.single:
        args.batch = 1
    runs = [one_run_single(args.n, root) if args.single else one_run(args.n, args.batch, root)
            for _ in range(args.reps)]
    med = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
    if args.json:
        print(json.dumps({"native": codec.NATIVE, "n": args.n, "batch": args.batch, "us_per_msg": med}))
        return
    print(f"codec: {'native' if codec.NATIVE else 'pure Python'}; n={args.n}, batches of {args.batch}, "
          f"median of {args.reps}, µs per message")
    for k, v in med.items():
        print(f"  {k:34s} {v:8.3f}")


if __name__ == "__main__":
    main()
