#!/usr/bin/env python3
"""Store throughput and latency, side by side with a raw framing ceiling and Redis Streams, in ONE run.

    python benchmarks/bench_store.py [--quick] [--out benchmarks/results] [--reps N]
    python benchmarks/bench_store.py --profile [--quick]     # where the time goes (py-spy, else cProfile)
    python benchmarks/bench_store.py --only memory [--quick] # RSS while 10 M (quick: 1 M) messages are appended

Every variant runs several times, interleaved (the order rotates each round), and is reported as the
median with min/max; ratios are taken round by round (both sides measured minutes apart at most) and
their median reported. Messages: 200-byte bodies (1,024 distinct random bodies in rotation), one user key
per message plus the UNIQ_KEY the store creates, 4 queues of one topic, ASYNC flush, default StoreConfig
(1 GiB sparse commitlog files, 5 M-slot / 20 M-entry index files). A put run "finishes" when
`store.wait_for_dispatch()` has returned and the consume queues and the index are checked to hold every
message. Stores live in
temporary directories under `var/bench/` and are deleted afterwards; Redis keys are `bench:rmq:<pid>:*`
and are deleted afterwards. Only 127.0.0.1 is contacted. Every loop has a fixed count and the whole run
a time limit (`--max-seconds`).

See benchmarks/README.md for what each number means and for the results.
"""

from __future__ import annotations

import argparse
import cProfile
import datetime as dt
import gc
import io
import json
import mmap
import os
import platform
import pstats
import random
import shutil
import statistics
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rmq_eventstore.common import codec  # noqa: E402
from rmq_eventstore.store import Message, MessageStore, PutMessageStatus  # noqa: E402

TOPIC = "BenchTopic"
QUEUES = 4
BODY_SIZE = 200
N_BODIES = 1024
GROUP = "bench"
SEED = 20261122
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379

FULL = dict(reps=5, single=100_000, batch=500_000, raw=500_000, redis_single=20_000, redis_pipe=200_000,
            read_store=500_000, read_samples=20_000, query_store=5_000_000, query_keys=2_000,
            query_passes=3, redis_query=1_000_000, profile=500_000, memory=10_000_000,
            memory_pull=1_000_000)
QUICK = dict(reps=3, single=20_000, batch=50_000, raw=50_000, redis_single=5_000, redis_pipe=50_000,
             read_store=50_000, read_samples=5_000, query_store=200_000, query_keys=2_000,
             query_passes=3, redis_query=200_000, profile=100_000, memory=1_000_000,
             memory_pull=200_000)

rng = random.Random(SEED)
BODIES = [rng.randbytes(BODY_SIZE) for _ in range(N_BODIES)]


class BenchTimeout(RuntimeError):
    pass


class Deadline:
    """The run's time limit: every loop calls check() at least once per batch / every few k iterations."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()

    def check(self) -> None:
        if time.monotonic() > self.end:
            raise BenchTimeout("the benchmark exceeded --max-seconds")


def log(*a: object) -> None:
    print(*a, file=sys.stderr, flush=True)


# -- statistics ----------------------------------------------------------------------------------------
def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "runs": [round(v, 1) if abs(v) >= 100 else round(v, 5) for v in values]}


def lat_stats(ns: list[int]) -> dict:
    us = np.asarray(ns, dtype=np.float64) / 1000.0
    p = np.percentile(us, [50, 90, 99, 99.9])
    return {"n": int(us.size), "p50_us": round(float(p[0]), 1), "p90_us": round(float(p[1]), 1),
            "p99_us": round(float(p[2]), 1), "p999_us": round(float(p[3]), 1),
            "max_us": round(float(us.max()), 1), "mean_us": round(float(us.mean()), 1)}


# -- machine -------------------------------------------------------------------------------------------
def timed_lookups(lookup: Callable[[str], object], is_right: Callable[[str, object], bool], keys: list[str],
                  passes: int, rr: random.Random, dl: Deadline) -> dict:
    """Latency of `lookup(key)` over `passes` shuffled passes of `keys`, and how many results `is_right`
    rejects (checked outside the timed region)."""
    lat: list[int] = []
    per_pass = []
    wrong = 0
    for _ in range(passes):
        order = keys[:]
        rr.shuffle(order)
        pl: list[int] = []
        for i, key in enumerate(order):
            t = time.perf_counter_ns()
            result = lookup(key)
            pl.append(time.perf_counter_ns() - t)
            if not is_right(key, result):
                wrong += 1
            if not i & 255:
                dl.check()
        per_pass.append(lat_stats(pl))
        lat += pl
    return {"all": lat_stats(lat), "passes": per_pass, "wrong_results": wrong, "keys": len(keys)}


def _cpu_times() -> list[int]:
    with open("/proc/stat") as f:
        return [int(x) for x in f.readline().split()[1:]]


def cpu_usage(before: list[int], after: list[int]) -> dict:
    d = [b - a for a, b in zip(before, after, strict=False)]
    total = sum(d[:8]) or 1
    # user nice system idle iowait irq softirq steal
    return {"busy_pct": round(100 * (total - d[3] - d[4]) / total, 1), "iowait_pct": round(100 * d[4] / total, 1),
            "steal_pct": round(100 * d[7] / total, 1)}


def calibration_ns() -> float:
    """One `for` iteration plus a lambda call (perf-baseline.md's calibration number), median of 5."""
    f = lambda x: x  # noqa: E731
    runs = []
    for _ in range(5):
        t = time.perf_counter_ns()
        for i in range(200_000):
            f(i)
        runs.append((time.perf_counter_ns() - t) / 200_000)
    return round(statistics.median(runs), 1)


def machine_info() -> dict:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "")
    except OSError:
        pass
    mem = 0
    try:
        with open("/proc/meminfo") as f:
            mem = int(next(ln.split()[1] for ln in f if ln.startswith("MemTotal"))) * 1024
    except (OSError, StopIteration):
        pass

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "nproc": os.cpu_count(), "affinity": len(os.sched_getaffinity(0)), "cpu": cpu, "mem_bytes": mem,
        "kernel": platform.release(), "python": sys.version.split()[0],
        "python_build": sysconfig.get_config_var("CONFIG_ARGS") or "", "numpy": np.__version__,
        "git_head": git("rev-parse", "HEAD"), "git_dirty_store": git("status", "--porcelain", "rmq_eventstore"),
        "native_codec": codec.NATIVE,  # the C record loops (issue 16), else RMQ_EVENTSTORE_PURE or not built
    }


# -- stores ----------------------------------------------------------------------------------------------
def make_messages(n: int, prefix: str) -> list[Message]:
    """n messages; keys are `prefix` (4 characters) + 10 digits, so every record has the same size."""
    return [Message(topic=TOPIC, body=BODIES[i & (N_BODIES - 1)], keys=f"{prefix}{i:010d}", queue_id=i % QUEUES)
            for i in range(n)]


def open_store(root: Path, name: str) -> tuple[MessageStore, str]:
    path = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    return MessageStore.open(path), path  # default StoreConfig: ASYNC_FLUSH, 1 GiB commitlog files


def close_store(store: MessageStore, path: str) -> None:
    try:
        store.shutdown()
    finally:
        shutil.rmtree(path, ignore_errors=True)


def wait_dispatched(store: MessageStore, dl: Deadline) -> None:
    for _ in range(10_000):
        if store.wait_for_dispatch(timeout=max(0.1, min(5.0, dl.left()))):
            return
        dl.check()
    raise BenchTimeout("dispatch did not catch up")


def dispatched_counts(store: MessageStore) -> tuple[int, int]:
    return (sum(store.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)),
            store.index_service.get_total_entries())


def wait_complete(store: MessageStore, n: int, dl: Deadline) -> float:
    """After wait_for_dispatch() returned: poll until the queues hold n entries and the index 2n.

    A safety net for the benchmark's clock: before commit 2f9925b, wait_for_dispatch() could return while
    the reput thread was still dispatching the last batch (up to 30 ms early was measured). The clock
    stops only when the entries are really there; returns how long that took after wait_for_dispatch
    returned (one poll, ~50 µs, when wait_for_dispatch is exact).
    """
    t0 = time.perf_counter()
    for i in range(1_000_000):
        q, e = dispatched_counts(store)
        if q >= n and e >= 2 * n:
            return time.perf_counter() - t0
        time.sleep(0.0002)
        if not i & 255:
            dl.check()
    raise BenchTimeout("dispatch never completed")


def check_store(store: MessageStore, n: int) -> dict:
    in_queues, entries = dispatched_counts(store)
    if in_queues != n or entries != 2 * n:
        raise AssertionError(f"store holds {in_queues} queue entries / {entries} index entries, expected {n} / {2 * n}")
    return {"queue_entries": in_queues, "index_entries": entries}


def _timed(n: int, fn: Callable[[], None], store: MessageStore, dl: Deadline) -> dict:
    c0, t0 = time.process_time(), time.perf_counter()
    fn()
    t1 = time.perf_counter()
    wait_dispatched(store, dl)
    late = wait_complete(store, n, dl)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"n": n, "rate": n / (t2 - t0), "put_return_rate": n / (t1 - t0), "seconds": t2 - t0,
            "dispatch_tail_s": t2 - t1, "cpu_rate": n / max(c2 - c0, 1e-9),
            "wait_for_dispatch_early_s": late}


def run_store_single(root: Path, n: int, rep: int, dl: Deadline) -> dict:
    msgs = make_messages(n, f"s{rep:02d}-")
    store, path = open_store(root, "single")
    errors = 0
    try:
        put, ok = store.put_message, PutMessageStatus.PUT_OK

        def go() -> None:
            nonlocal errors
            for i, m in enumerate(msgs):
                if put(m).status is not ok:
                    errors += 1
                if not i & 4095:
                    dl.check()

        out = _timed(n, go, store, dl)
        out.update(check_store(store, n), errors=errors)
        return out
    finally:
        close_store(store, path)


def run_store_batch(root: Path, n: int, batch: int, rep: int, dl: Deadline) -> dict:
    msgs = make_messages(n, f"{'h' if batch == 100 else 't'}{rep:02d}-")
    batches = [msgs[i:i + batch] for i in range(0, n, batch)]
    store, path = open_store(root, f"batch{batch}")
    errors = 0
    try:
        put, ok = store.put_messages, PutMessageStatus.PUT_OK

        def go() -> None:
            nonlocal errors
            for b in batches:
                if put(b).status is not ok:
                    errors += 1
                dl.check()

        out = _timed(n, go, store, dl)
        out.update(check_store(store, n), errors=errors)
        out["record_size"] = len(store.select_one_message_by_offset(0) or b"")
        return out
    finally:
        close_store(store, path)


# -- the raw ceiling (perf-baseline.md §5 b5) -------------------------------------------------------------
def record_layout() -> tuple[int, bytes]:
    """Size of the store's record for our messages and a V1 topic+properties tail of the same length."""
    props = f"KEYS\x01s00-{0:010d}\x02UNIQ_KEY\x01{'0' * 32}\x02".encode()
    tail = bytes((len(TOPIC),)) + TOPIC.encode() + struct.pack(">h", len(props)) + props
    return 88 + BODY_SIZE + len(tail), tail


def run_raw(root: Path, n: int, dl: Deadline) -> dict:
    """V1 records packed with a precompiled Struct into a 4 MiB bytearray through a memoryview, body and
    a constant tail copied in through the memoryview, one copy per 4 MiB into an mmap of a fresh sparse
    1 GiB file. Body CRC per record, store time per 1,000 records; no locks, queues, index or dispatch."""
    size, tail = record_layout()
    hdr = struct.Struct(">iiiiiqqiq4siq4siiqi")
    assert hdr.size == 88
    pack = hdr.pack_into
    crc32 = zlib.crc32
    addr, port = bytes([127, 0, 0, 1]), 10911
    magic = codec.MESSAGE_MAGIC_CODE
    fd, path = tempfile.mkstemp(prefix="raw-", dir=root)
    fsize = 1 << 30
    try:
        os.ftruncate(fd, fsize)
        mm = mmap.mmap(fd, fsize)
        buf = bytearray(4 << 20)
        mv = memoryview(buf)
        cap = len(buf) - size
        qoffs = [0] * QUEUES
        c0, t0 = time.process_time(), time.perf_counter()
        pos = fpos = 0
        now = int(time.time() * 1000)
        b0, b1, b2 = 88, 88 + BODY_SIZE, size
        for i in range(n):
            if not i % 1000:
                now = int(time.time() * 1000)
                dl.check()
            body = BODIES[i & (N_BODIES - 1)]
            q = i % QUEUES
            qo = qoffs[q]
            qoffs[q] = qo + 1
            pack(mv, pos, size, magic, crc32(body) & 0x7FFFFFFF, q, 0, qo, fpos + pos, 0, now, addr, port, now,
                 addr, port, 0, 0, BODY_SIZE)
            mv[pos + b0:pos + b1] = body
            mv[pos + b1:pos + b2] = tail
            pos += size
            if pos > cap:
                mm[fpos:fpos + pos] = mv[:pos]
                fpos += pos
                pos = 0
        if pos:
            mm[fpos:fpos + pos] = mv[:pos]
            fpos += pos
        t1, c1 = time.perf_counter(), time.process_time()
        mv.release()
        mm.close()
        return {"n": n, "rate": n / (t1 - t0), "seconds": t1 - t0, "cpu_rate": n / max(c1 - c0, 1e-9),
                "record_size": size, "bytes": fpos}
    finally:
        os.close(fd)
        os.unlink(path)


# -- Redis ---------------------------------------------------------------------------------------------
def redis_client():
    import redis

    return redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=30)


def redis_info() -> dict:
    try:
        import redis
        from redis.utils import HIREDIS_AVAILABLE

        r = redis_client()
        info = r.info("server")
        return {"available": True, "server": info.get("redis_version"), "redis_py": redis.__version__,
                "hiredis": bool(HIREDIS_AVAILABLE), "persistence": r.config_get("appendonly")}
    except Exception as e:  # noqa: BLE001 - reported, the store part still runs
        return {"available": False, "error": repr(e)}


def redis_fields(n: int, prefix: str) -> list[dict]:
    return [{"d": BODIES[i & (N_BODIES - 1)], "k": f"{prefix}{i:010d}"} for i in range(n)]


def run_redis_single(n: int, rep: int, dl: Deadline) -> dict:
    r = redis_client()
    stream = f"bench:rmq:{os.getpid()}:single:{rep}"
    fields = redis_fields(n, f"u{rep:02d}-")
    r.delete(stream)
    try:
        xadd = r.xadd
        c0, t0 = time.process_time(), time.perf_counter()
        for i, f in enumerate(fields):
            xadd(stream, f)
            if not i & 1023:
                dl.check()
        t1, c1 = time.perf_counter(), time.process_time()
        if r.xlen(stream) != n:
            raise AssertionError("XLEN mismatch")
        return {"n": n, "rate": n / (t1 - t0), "seconds": t1 - t0, "client_cpu_rate": n / max(c1 - c0, 1e-9)}
    finally:
        r.delete(stream)


def redis_fill_pipelined(r, stream: str, fields: list[dict], batch: int, dl: Deadline) -> None:
    for i in range(0, len(fields), batch):
        pipe = r.pipeline(transaction=False)
        for f in fields[i:i + batch]:
            pipe.xadd(stream, f)
        pipe.execute()
        dl.check()


def run_redis_pipe(n: int, rep: int, dl: Deadline, batch: int = 100) -> dict:
    r = redis_client()
    stream = f"bench:rmq:{os.getpid()}:pipe:{rep}"
    fields = redis_fields(n, f"v{rep:02d}-")
    r.delete(stream)
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        redis_fill_pipelined(r, stream, fields, batch, dl)
        t1, c1 = time.perf_counter(), time.process_time()
        if r.xlen(stream) != n:
            raise AssertionError("XLEN mismatch")
        return {"n": n, "rate": n / (t1 - t0), "seconds": t1 - t0, "client_cpu_rate": n / max(c1 - c0, 1e-9)}
    finally:
        r.delete(stream)


# -- phase 1: write throughput ---------------------------------------------------------------------------
def phase_throughput(root: Path, cfg: dict, dl: Deadline, with_redis: bool) -> dict:
    variants: list[tuple[str, Callable[[int], dict]]] = [
        ("store put_message", lambda rep: run_store_single(root, cfg["single"], rep, dl)),
        ("store put_messages x100", lambda rep: run_store_batch(root, cfg["batch"], 100, rep, dl)),
        ("store put_messages x1000", lambda rep: run_store_batch(root, cfg["batch"], 1000, rep, dl)),
        ("raw framing ceiling (b5)", lambda rep: run_raw(root, cfg["raw"], dl)),
    ]
    if with_redis:
        variants += [
            ("redis XADD single", lambda rep: run_redis_single(cfg["redis_single"], rep, dl)),
            ("redis XADD pipelined x100", lambda rep: run_redis_pipe(cfg["redis_pipe"], rep, dl)),
        ]
    runs: dict[str, list[dict]] = defaultdict(list)
    for rep in range(cfg["reps"]):
        k = rep % len(variants)
        for name, fn in variants[k:] + variants[:k]:
            gc.collect()
            res = fn(rep)
            runs[name].append(res)
            log(f"  round {rep + 1}/{cfg['reps']}  {name:28s} {res['rate']:>10,.0f} msgs/s")
    out: dict = {"variants": {}, "ratios": {}}
    for name, rs in runs.items():
        v = {"n": rs[0]["n"], "rate": spread([r["rate"] for r in rs])}
        for extra in ("put_return_rate", "cpu_rate", "client_cpu_rate", "dispatch_tail_s",
                      "wait_for_dispatch_early_s"):
            if extra in rs[0]:
                v[extra] = spread([r[extra] for r in rs])
        if "record_size" in rs[0]:
            v["record_size"] = rs[0]["record_size"]
        if "errors" in rs[0]:
            v["errors"] = sum(r["errors"] for r in rs)
        out["variants"][name] = v
    refs = ["raw framing ceiling (b5)"] + (["redis XADD single", "redis XADD pipelined x100"] if with_redis else [])
    for name in ("store put_message", "store put_messages x100", "store put_messages x1000"):
        for ref in refs:
            per_round = [a["rate"] / b["rate"] for a, b in zip(runs[name], runs[ref], strict=True)]
            out["ratios"][f"{name} / {ref}"] = {
                "median_of_rounds": round(statistics.median(per_round), 3),
                "min": round(min(per_round), 3), "max": round(max(per_round), 3),
                "ratio_of_medians": round(out["variants"][name]["rate"]["median"]
                                          / out["variants"][ref]["rate"]["median"], 3)}
    return out


# -- phase 4: memory while appending ----------------------------------------------------------------------
def memory_status() -> dict[str, int]:
    """This process's resident memory in KiB (/proc/self/status): VmRSS = RssAnon (heap: Python objects,
    buffers) + RssFile (mapped file pages: the commitlog, consume queues and index being written) + RssShmem."""
    out: dict[str, int] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                k, _, v = line.partition(":")
                if k in ("VmRSS", "RssAnon", "RssFile", "RssShmem"):
                    out[k] = int(v.split()[0])
    except OSError:
        pass
    return out


def phase_memory(root: Path, cfg: dict, dl: Deadline) -> dict:
    """RSS while `cfg['memory']` messages are appended with put_messages x1000 (Message objects built per
    batch and dropped, as fill_store_batched does), sampled 20 times: flat RssAnon means nothing is kept
    per message (hand-off chunks, per-record objects); RssFile grows with the mapped pages written."""
    n = cfg["memory"]
    batch = 1000
    every = max(batch, (n // 20) // batch * batch)
    store, path = open_store(root, "memory")
    samples: list[dict] = []
    try:
        gc.collect()
        put = store.put_messages
        t0 = time.perf_counter()
        samples.append({"appended": 0, "s": 0.0, **memory_status()})
        for start in range(0, n, batch):
            msgs = [Message(topic=TOPIC, body=BODIES[i & (N_BODIES - 1)], keys=f"m00-{i:010d}", queue_id=i % QUEUES)
                    for i in range(start, min(n, start + batch))]
            if put(msgs).status is not PutMessageStatus.PUT_OK:
                raise AssertionError("put_messages failed")
            done = start + len(msgs)
            if done % every == 0 and done < n:
                samples.append({"appended": done, "s": round(time.perf_counter() - t0, 2), **memory_status()})
            dl.check()
        wait_dispatched(store, dl)
        wait_complete(store, n, dl)
        t1 = time.perf_counter()
        samples.append({"appended": n, "s": round(t1 - t0, 2), **memory_status()})
        check_store(store, n)
        pulled = phase_memory_pull(store, min(n, cfg["memory_pull"]), dl)
    finally:
        close_store(store, path)
    anon = [x.get("RssAnon", 0) for x in samples]
    # growth of the heap from the first tenth on (the first batches warm caches and allocators up)
    ref = anon[min(2, len(anon) - 1)]
    out = {"n": n, "seconds": round(t1 - t0, 1), "rate": n / (t1 - t0), "samples": samples,
           "rss_anon_mib_start": round(anon[0] / 1024, 1), "rss_anon_mib_max": round(max(anon) / 1024, 1),
           "rss_anon_growth_mib_after_warmup": round((max(anon[2:] or anon) - ref) / 1024, 1),
           "rss_anon_bytes_per_msg_after_warmup": round((anon[-1] - ref) * 1024 / max(1, n - samples[min(2, len(samples) - 1)]["appended"]), 2),
           "rss_file_mib_end": round(samples[-1].get("RssFile", 0) / 1024, 1),
           "vm_rss_mib_max": round(max(x.get("VmRSS", 0) for x in samples) / 1024, 1), "pull": pulled}
    log(f"  memory: {n:,} msgs in {out['seconds']} s; RssAnon {out['rss_anon_mib_start']} -> max "
        f"{out['rss_anon_mib_max']} MiB (growth after warm-up {out['rss_anon_growth_mib_after_warmup']} MiB), "
        f"RssFile at the end {out['rss_file_mib_end']} MiB")
    p = pulled
    log(f"  memory while pulling: {p['n']:,} msgs decoded in {p['seconds']} s; RssAnon "
        f"{p['rss_anon_mib_start']} -> max {p['rss_anon_mib_max']} MiB")
    return out


def phase_memory_pull(store: MessageStore, n: int, dl: Deadline) -> dict:
    """RSS while `n` messages are pulled back, 32 per get_message and decoded to MessageExt (then dropped),
    queue by queue from offset 0, sampled 20 times: flat RssAnon means a pull keeps nothing behind."""
    per_queue = n // QUEUES
    every = max(32, n // 20)
    samples = [{"pulled": 0, "s": 0.0, **memory_status()}]
    gc.collect()
    t0 = time.perf_counter()
    done = next_sample = 0
    for q in range(QUEUES):
        offset = 0
        while offset < per_queue:
            res = store.get_message(GROUP, TOPIC, q, offset, min(32, per_queue - offset))
            if res is None or not res.messages:
                raise AssertionError(f"pull at queue {q} offset {offset} returned nothing")
            got = len(res.messages)
            offset = res.next_begin_offset
            done += got
            if done >= next_sample + every:
                next_sample = done
                samples.append({"pulled": done, "s": round(time.perf_counter() - t0, 2), **memory_status()})
                dl.check()
    t1 = time.perf_counter()
    samples.append({"pulled": done, "s": round(t1 - t0, 2), **memory_status()})
    anon = [x.get("RssAnon", 0) for x in samples]
    return {"n": done, "seconds": round(t1 - t0, 1), "rate": done / (t1 - t0), "samples": samples,
            "rss_anon_mib_start": round(anon[0] / 1024, 1), "rss_anon_mib_max": round(max(anon) / 1024, 1),
            "rss_anon_growth_mib": round((max(anon) - anon[0]) / 1024, 1)}


# -- phase 2: reads ---------------------------------------------------------------------------------------
def fill_store_batched(store: MessageStore, n: int, prefix: str, dl: Deadline, batch: int = 1000,
                       collect: Callable[[int, object], None] | None = None) -> dict:
    """put_messages in batches of `batch`, Message objects built per batch inside the timed loop."""
    c0, t0 = time.process_time(), time.perf_counter()
    put = store.put_messages
    for start in range(0, n, batch):
        msgs = [Message(topic=TOPIC, body=BODIES[i & (N_BODIES - 1)], keys=f"{prefix}{i:010d}", queue_id=i % QUEUES)
                for i in range(start, min(n, start + batch))]
        r = put(msgs)
        if r.status is not PutMessageStatus.PUT_OK:
            raise AssertionError(f"put_messages failed: {r}")
        if collect is not None:
            collect(start, r)
        dl.check()
    t1 = time.perf_counter()
    wait_dispatched(store, dl)
    late = wait_complete(store, n, dl)
    t2, c2 = time.perf_counter(), time.process_time()
    return {"n": n, "wait_for_dispatch_early_s": round(late, 4), "seconds": round(t2 - t0, 2), "rate": n / (t2 - t0), "put_return_seconds": round(t1 - t0, 2),
            "cpu_seconds": round(c2 - c0, 2)}


def phase_reads(root: Path, cfg: dict, dl: Deadline, with_redis: bool) -> dict:
    n = cfg["read_store"]
    out: dict = {"n": n}
    store, path = open_store(root, "reads")
    try:
        offsets: list[int] = []
        out["build"] = fill_store_batched(store, n, "r00-", dl,
                                          collect=lambda _s, r: offsets.extend(r.append_result.offsets))
        check_store(store, n)
        maxq = [store.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)]

        def pull_all(decode: bool) -> float:
            got = 0
            t0 = time.perf_counter()
            for q in range(QUEUES):
                off = 0
                for _ in range(maxq[q] + 10):
                    res = store.get_message(GROUP, TOPIC, q, off, 32)
                    if res.status.name != "FOUND":
                        break
                    if decode:
                        for m in res.messages:
                            _ = m.body
                    got += res.message_count
                    off = res.next_begin_offset
                dl.check()
            dt_ = time.perf_counter() - t0
            if got != n:
                raise AssertionError(f"pulled {got} of {n}")
            return n / dt_

        raw_r, dec_r = [], []
        for _ in range(3):
            raw_r.append(pull_all(False))
            dec_r.append(pull_all(True))
        out["get_message_x32_raw_rate"] = spread(raw_r)
        out["get_message_x32_decoded_rate"] = spread(dec_r)
        log(f"  get_message x32: raw {statistics.median(raw_r):,.0f}/s, decoded {statistics.median(dec_r):,.0f}/s")

        k = cfg["read_samples"]
        rr = random.Random(SEED + 1)
        lat = []
        for i in range(k):
            q = rr.randrange(QUEUES)
            off = rr.randrange(maxq[q])
            t = time.perf_counter_ns()
            res = store.get_message(GROUP, TOPIC, q, off, 1)
            lat.append(time.perf_counter_ns() - t)
            if res.message_count != 1:
                raise AssertionError("get_message(max_msg_nums=1) found nothing")
            if not i & 1023:
                dl.check()
        out["get_message_1_latency"] = lat_stats(lat)
        lat = []
        for i in range(k):
            off = offsets[rr.randrange(n)]
            t = time.perf_counter_ns()
            m = store.look_message_by_offset(off)
            lat.append(time.perf_counter_ns() - t)
            if m is None or m.commit_log_offset != off:
                raise AssertionError("look_message_by_offset failed")
            if not i & 1023:
                dl.check()
        out["look_message_by_offset_latency"] = lat_stats(lat)
        log(f"  get_message(1) p50 {out['get_message_1_latency']['p50_us']} us, "
            f"look_message_by_offset p50 {out['look_message_by_offset_latency']['p50_us']} us")
    finally:
        close_store(store, path)

    if with_redis:
        r = redis_client()
        rn = cfg["redis_pipe"]
        stream = f"bench:rmq:{os.getpid()}:read"
        r.delete(stream)
        try:
            redis_fill_pipelined(r, stream, redis_fields(rn, "x00-"), 1000, dl)
            rates = []
            ids: list[bytes] = []
            for rep in range(3):
                got = 0
                start = "-"
                t0 = time.perf_counter()
                for _ in range(rn // 1000 + 10):
                    page = r.xrange(stream, start, "+", count=1000)
                    if not page:
                        break
                    got += len(page)
                    if rep == 0:
                        ids.extend(e[0] for e in page)
                    start = b"(" + page[-1][0]
                    dl.check()
                rates.append(got / (time.perf_counter() - t0))
                if got != rn:
                    raise AssertionError(f"XRANGE read {got} of {rn}")
            out["redis_xrange_x1000_rate"] = spread(rates)
            rr = random.Random(SEED + 2)
            lat = []
            for i in range(cfg["read_samples"]):
                eid = ids[rr.randrange(rn)]
                t = time.perf_counter_ns()
                e = r.xrange(stream, eid, eid)
                lat.append(time.perf_counter_ns() - t)
                if len(e) != 1:
                    raise AssertionError("XRANGE id id found nothing")
                if not i & 1023:
                    dl.check()
            out["redis_xrange_one_latency"] = lat_stats(lat)
            log(f"  redis XRANGE x1000 {statistics.median(rates):,.0f}/s, one entry p50 "
                f"{out['redis_xrange_one_latency']['p50_us']} us")
        finally:
            r.delete(stream)
    return out


# -- phase 3: query by key --------------------------------------------------------------------------------
def phase_query(root: Path, cfg: dict, dl: Deadline, with_redis: bool) -> dict:
    n = cfg["query_store"]
    nk = cfg["query_keys"]
    passes = cfg["query_passes"]
    out: dict = {"n_messages": n}
    rr = random.Random(SEED + 3)
    store, path = open_store(root, "query")
    try:
        uniq_sample: list[str] = []
        per_batch = -(-nk // max(1, n // 1000)) + 1

        def collect(_start: int, r) -> None:
            keys = r.append_result.uniq_keys
            uniq_sample.extend(rr.sample(keys, min(per_batch, len(keys))))

        log(f"  building a {n:,}-message store with put_messages x1000 ...")
        out["build"] = fill_store_batched(store, n, "k00-", dl, collect=collect)
        out["build"].update(check_store(store, n))
        out["index_entries"] = out["build"]["index_entries"]
        out["index_files"] = len(store.index_service.files)
        log(f"  built in {out['build']['seconds']} s ({out['build']['rate']:,.0f} msgs/s), "
            f"{out['index_entries']:,} index entries")

        def run_queries(keys: list[str], expect: int, check_key: bool) -> dict:
            def right(key: str, res: object) -> bool:
                msgs = res.messages  # type: ignore[attr-defined]
                return len(msgs) == expect and not (check_key and expect
                                                    and key not in (msgs[0].keys, msgs[0].uniq_key))
            return timed_lookups(lambda key: store.query_message(TOPIC, key), right, keys, passes, rr, dl)

        user_keys = [f"k00-{i:010d}" for i in rr.sample(range(n), min(nk, n))]
        missing = [f"nokey-{rr.getrandbits(48):012x}" for _ in range(nk)]
        uniq_keys = rr.sample(uniq_sample, min(nk, len(uniq_sample)))
        out["query_key"] = run_queries(user_keys, 1, True)
        out["query_uniq_key"] = run_queries(uniq_keys, 1, True)
        out["query_missing"] = run_queries(missing, 0, False)
        for name in ("query_key", "query_uniq_key", "query_missing"):
            a = out[name]["all"]
            log(f"  {name:15s} p50 {a['p50_us']} us  p99 {a['p99_us']} us  p99.9 {a['p999_us']} us "
                f"(wrong {out[name]['wrong_results']})")
    finally:
        close_store(store, path)

    if with_redis:
        rn = min(n, cfg["redis_query"])
        r = redis_client()
        stream, idx = f"bench:rmq:{os.getpid()}:qstream", f"bench:rmq:{os.getpid()}:qindex"
        r.delete(stream, idx)
        try:
            log(f"  building a {rn:,}-entry Redis stream + key hash (pipelined x1000) ...")
            t0 = time.perf_counter()
            for start in range(0, rn, 1000):
                pipe = r.pipeline(transaction=False)
                keys = [f"k00-{i:010d}" for i in range(start, min(rn, start + 1000))]
                for i, key in enumerate(keys, start):
                    pipe.xadd(stream, {"d": BODIES[i & (N_BODIES - 1)], "k": key})
                ids = pipe.execute()
                r.hset(idx, mapping=dict(zip(keys, ids, strict=True)))
                dl.check()
            build_s = time.perf_counter() - t0
            out["redis_build"] = {"n": rn, "seconds": round(build_s, 2), "rate": rn / build_s,
                                  "used_memory": r.info("memory").get("used_memory")}
            hget, xrange = r.hget, r.xrange

            def lookups(keys: list[str], expect: int) -> dict:
                def lookup(key: str) -> list:
                    eid = hget(idx, key)
                    return xrange(stream, eid, eid) if eid is not None else []
                return timed_lookups(lookup, lambda _k, entries: len(entries) == expect, keys, passes, rr, dl)

            rkeys = [f"k00-{i:010d}" for i in rr.sample(range(rn), min(nk, rn))]
            out["redis_lookup_key"] = lookups(rkeys, 1)
            out["redis_lookup_missing"] = lookups(missing, 0)
            for name in ("redis_lookup_key", "redis_lookup_missing"):
                a = out[name]["all"]
                log(f"  {name:20s} p50 {a['p50_us']} us  p99 {a['p99_us']} us  p99.9 {a['p999_us']} us")
        finally:
            r.delete(stream, idx)
    return out


def targets(results: dict) -> dict:
    """The issue's targets, each with the measured value and whether it was met (None: not measured)."""
    out: dict = {}
    tp = results.get("throughput", {}).get("variants", {})
    if tp:
        best = max(tp[k]["rate"]["median"] for k in ("store put_messages x100", "store put_messages x1000"))
        single = tp["store put_message"]["rate"]["median"]
        out["batched >= 300k msgs/s"] = {"measured": round(best), "met": best >= 300_000}
        out["single >= 100k msgs/s"] = {"measured": round(single), "met": single >= 100_000}
        ratios = results["throughput"]["ratios"]
        rb = max(ratios[f"store put_messages x{b} / raw framing ceiling (b5)"]["median_of_rounds"] for b in (100, 1000))
        rs = ratios["store put_message / raw framing ceiling (b5)"]["median_of_rounds"]
        out["batched >= 1.0x raw ceiling (issue 16)"] = {"measured": rb, "met": rb >= 1.0}
        out["single >= 150k msgs/s and >= 0.3x raw ceiling (issue 16)"] = {
            "measured": round(single), "ratio": rs, "met": single >= 150_000 and rs >= 0.3}
    q = results.get("query", {})
    if "query_key" in q:
        p99 = max(q["query_key"]["all"]["p99_us"], q["query_uniq_key"]["all"]["p99_us"])
        big = q["index_entries"] >= 10_000_000
        out["query p99 <= 1 ms, index >= 10M entries"] = {
            "measured_p99_us": p99, "index_entries": q["index_entries"],
            "met": (p99 <= 1000) if big else None}
    return out


# -- charts -------------------------------------------------------------------------------------------------
def plot(results: dict, out_dir: Path, suffix: str) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    written = []
    tp = results["throughput"]["variants"]
    names = list(tp)
    med = [tp[k]["rate"]["median"] for k in names]
    lo = [tp[k]["rate"]["median"] - tp[k]["rate"]["min"] for k in names]
    hi = [tp[k]["rate"]["max"] - tp[k]["rate"]["median"] for k in names]
    colors = ["#1f77b4" if k.startswith("store") else "#7f7f7f" if k.startswith("raw") else "#d62728" for k in names]
    fig, ax = plt.subplots(figsize=(11, 5.6), dpi=110)
    y = np.arange(len(names))[::-1]
    ax.barh(y, med, xerr=[lo, hi], color=colors, capsize=4, height=0.6)
    top = max(m + h for m, h in zip(med, hi, strict=True))
    for yi, m, h in zip(y, med, hi, strict=True):
        ax.text(m + h + top * 0.01, yi, f"{m / 1000:,.0f} k", va="center", fontsize=9, fontweight="bold")
    ax.set_yticks(y, [f"{k}\n(n={tp[k]['n']:,} per run)" for k in names], fontsize=8.5)
    for target, label in ((100_000, "target: single\n100 k"), (300_000, "target: batched\n300 k")):
        ax.axvline(target, color="black", ls="--", lw=0.8)
        ax.text(target + top * 0.008, len(names) - 0.55, label, fontsize=8, ha="left", va="center")
    ax.set_xlim(0, max(top * 1.12, 330_000))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _p: f"{v / 1000:,.0f} k"))
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color="#1f77b4", label="rmq_eventstore (put + dispatch)"),
                       Patch(color="#7f7f7f", label="raw V1 framing into mmap (no store logic)"),
                       Patch(color="#d62728", label="Redis Streams via redis-py + hiredis")],
              fontsize=8, loc="center right")
    ax.set_xlabel("messages/s, 200 B bodies (median of runs; bars = min..max); store includes dispatch")
    m = results["machine"]
    ax.set_title(f"rmq_eventstore put throughput vs raw ceiling and Redis Streams - {results['date']}\n"
                 f"{m['nproc']} vCPU, load avg {m['loadavg_before'][0]:.1f} -> {m['loadavg_after'][0]:.1f}, "
                 f"Python {m['python']}{' (--quick)' if results['quick'] else ''}", fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    p = out_dir / f"store-throughput{suffix}.png"
    fig.savefig(p)
    plt.close(fig)
    written.append(str(p))

    rows = []
    q = results.get("query", {})
    rd = results.get("reads", {})
    for label, d in (("store\nquery_message\nuser key", q.get("query_key", {}).get("all")),
                     ("store\nquery_message\nUNIQ_KEY", q.get("query_uniq_key", {}).get("all")),
                     ("store\nquery_message\nmissing key", q.get("query_missing", {}).get("all")),
                     ("Redis\nHGET + XRANGE\nkey", q.get("redis_lookup_key", {}).get("all")),
                     ("Redis\nHGET\nmissing key", q.get("redis_lookup_missing", {}).get("all")),
                     ("store\nget_message\n1 msg, random", rd.get("get_message_1_latency")),
                     ("store\nlook_message\n_by_offset", rd.get("look_message_by_offset_latency")),
                     ("Redis\nXRANGE id id\nrandom", rd.get("redis_xrange_one_latency"))):
        if d:
            rows.append((label, d))
    if rows:
        fig, ax = plt.subplots(figsize=(12, 5.6), dpi=110)
        x = np.arange(len(rows))
        w = 0.27
        for j, (key, lab) in enumerate((("p50_us", "p50"), ("p99_us", "p99"), ("p999_us", "p99.9"))):
            vals = [d[key] for _, d in rows]
            bars = ax.bar(x + (j - 1) * w, vals, w, label=lab)
            for b, v in zip(bars, vals, strict=True):
                ax.text(b.get_x() + b.get_width() / 2, v * 1.05, f"{v:,.0f}", ha="center", fontsize=7, rotation=90)
        ax.set_yscale("log")
        ax.axhline(1000, color="black", ls="--", lw=0.8)
        ax.text(len(rows) - 0.5, 1100, "1 ms target (query p99)", fontsize=8, ha="right")
        ax.set_xticks(x, [lab for lab, _ in rows], fontsize=8)
        ax.set_ylabel("latency, µs (log scale)")
        ax.set_title(f"Lookup latency - store index {q.get('index_entries', 0):,} entries "
                     f"({q.get('n_messages', 0):,} msgs), Redis {q.get('redis_build', {}).get('n', 0):,} keys "
                     f"- {results['date']}", fontsize=10)
        ax.set_ylim(top=max(d["p999_us"] for _, d in rows) * 4)
        ax.legend(fontsize=8, loc="upper left")
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        p = out_dir / f"store-latency{suffix}.png"
        fig.savefig(p)
        plt.close(fig)
        written.append(str(p))
    return written


# -- markdown summary (pasted into the README) ------------------------------------------------------------
def markdown(results: dict) -> str:
    tp = results["throughput"]["variants"]
    ratios = results["throughput"]["ratios"]
    lines = ["| variant | n per run | msgs/s median | min – max | CPU-time rate | / raw ceiling | / Redis single "
             "| / Redis pipelined |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for name, v in tp.items():
        r = v["rate"]
        cpu = v.get("cpu_rate", v.get("client_cpu_rate"))
        cells = []
        for ref in ("raw framing ceiling (b5)", "redis XADD single", "redis XADD pipelined x100"):
            rk = ratios.get(f"{name} / {ref}")
            cells.append(f"{rk['median_of_rounds']:.2f}" if rk else "")
        lines.append(f"| {name} | {v['n']:,} | {r['median']:,.0f} | {r['min']:,.0f} – {r['max']:,.0f} | "
                     f"{cpu['median']:,.0f} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| latency | n | p50 µs | p99 µs | p99.9 µs | max µs |")
    lines.append("|---|---:|---:|---:|---:|---:|")
    q, rd = results.get("query", {}), results.get("reads", {})
    for label, d in (("store query_message, existing user key", q.get("query_key", {}).get("all")),
                     ("store query_message, existing UNIQ_KEY", q.get("query_uniq_key", {}).get("all")),
                     ("store query_message, missing key", q.get("query_missing", {}).get("all")),
                     ("Redis HGET + XRANGE id id, existing key", q.get("redis_lookup_key", {}).get("all")),
                     ("Redis HGET, missing key", q.get("redis_lookup_missing", {}).get("all")),
                     ("store get_message(max_msg_nums=1), random offset", rd.get("get_message_1_latency")),
                     ("store look_message_by_offset, random", rd.get("look_message_by_offset_latency")),
                     ("Redis XRANGE id id, random", rd.get("redis_xrange_one_latency"))):
        if d:
            lines.append(f"| {label} | {d['n']:,} | {d['p50_us']:,} | {d['p99_us']:,} | {d['p999_us']:,} | "
                         f"{d['max_us']:,} |")
    lines.append("")
    for label, d in (("store get_message x32, raw buffers", rd.get("get_message_x32_raw_rate")),
                     ("store get_message x32, decoded (.messages)", rd.get("get_message_x32_decoded_rate")),
                     ("Redis XRANGE pages of 1000", rd.get("redis_xrange_x1000_rate"))):
        if d:
            lines.append(f"- {label}: {d['median']:,.0f} msgs/s ({d['min']:,.0f} – {d['max']:,.0f})")
    if "build" in q:
        b = q["build"]
        lines.append(f"- query store build: {q['n_messages']:,} msgs, put_messages x1000, {b['seconds']} s "
                     f"({b['rate']:,.0f} msgs/s incl. dispatch), index entries {q['index_entries']:,}")
    mem = results.get("memory")
    if mem:
        lines.append(f"- memory while appending {mem['n']:,} msgs (put_messages x1000, {mem['rate']:,.0f} msgs/s): "
                     f"RssAnon {mem['rss_anon_mib_start']} MiB at the start, max {mem['rss_anon_mib_max']} MiB, "
                     f"growth after warm-up {mem['rss_anon_growth_mib_after_warmup']} MiB; RssFile (mapped pages "
                     f"written) {mem['rss_file_mib_end']} MiB at the end")
    if "redis_build" in q:
        b = q["redis_build"]
        lines.append(f"- Redis build: {b['n']:,} XADD + HSET pipelined x1000, {b['seconds']} s ({b['rate']:,.0f}/s)")
    return "\n".join(lines)


# -- profile ----------------------------------------------------------------------------------------------
# A sample belongs to the innermost matching frame (the stack is walked from the leaf towards the root);
# samples under one of OUTSIDE happen outside the timed loop (imports, Message objects, open, shutdown).
OUTSIDE = ("_find_and_load", "make_messages", "open_store", "close_store", "MessageStore.open",
           "MessageStore.shutdown", "MessageStore.load")
PROFILE_CATEGORIES = [
    ("UniqueIdGenerator.", "prepare: UNIQ_KEY ids"),
    ("CommitLog._uniq_keys", "prepare: UNIQ_KEY ids"),
    ("RecordEncoder.", "prepare: encode record (outside the lock)"),
    ("CommitLog._check", "prepare: checks (topic, queue id)"),
    ("CommitLog._prepare", "prepare: encode record (outside the lock)"),
    ("CommitLog.put_messages", "prepare: batch loop"),
    ("MappedFile.append_message", "append: join + copy into the mmap"),
    ("ReputMessageService.notify_appended", "append: hand-off to reput"),
    ("CommitLog._append", "append: locked section (offsets, DispatchRequests, emit)"),
    ("java_string_hashes", "dispatch: index key hashing (numpy)"),
    ("index_key_hashes", "dispatch: index key hashing (numpy)"),
    ("IndexFile.put_keys", "dispatch: index insert"),
    ("IndexService.", "dispatch: index key strings + arrays"),
    ("ConsumeQueue.", "dispatch: consume queue"),
    ("MessageStore._dispatch", "dispatch: grouping per queue"),
    ("ReputMessageService.", "dispatch: reput loop (hand-off, parse)"),
    ("MappedFileQueue.flush", "flush thread (msync, GIL released)"),
    ("MessageStore._flush_loop", "flush thread (msync, GIL released)"),
    ("MessageStore.put_messages", "prepare: batch loop"),
    ("profile_workload.<locals>.go", "benchmark loop"),
]


def _frame_name(frame: str) -> str:
    return frame.split(" (", 1)[0]


def _source_line(frame: str) -> str:
    """The source text of a py-spy frame `name (path:line)`, '' when unknown."""
    try:
        loc = frame.rsplit(" (", 1)[1].rstrip(")")
        path, line = loc.rsplit(":", 1)
        import linecache

        full = path if os.path.isabs(path) else str(REPO / path)
        return linecache.getline(full, int(line)).strip()
    except (IndexError, ValueError):
        return ""


def categorise(frames: list[str]) -> str:
    names = [_frame_name(f) for f in frames]
    if any(n in OUTSIDE for n in names):
        return "outside the timed loop"
    for name in reversed(names):
        for anchor, cat in PROFILE_CATEGORIES:
            if name.startswith(anchor) if anchor.endswith(".") else name == anchor:
                return cat
    return "other"


def is_waiting(frames: list[str]) -> bool:
    """py-spy counts a thread blocked in Event.wait / time.sleep as active; drop those samples."""
    leaf = frames[-1]
    if _frame_name(leaf) in ("Condition.wait", "Event.wait", "Thread.join", "Condition.wait_for"):
        return True
    src = _source_line(leaf)
    return "sleep(" in src or ".wait(" in src


def profile_workload(root: Path, n: int, batch: int = 1000) -> dict:
    """The batched put path, dispatch included, in a fresh store (what --profile samples)."""
    dl = Deadline(600)
    msgs = make_messages(n, "p00-")
    batches = [msgs[i:i + batch] for i in range(0, n, batch)]
    store, path = open_store(root, "profile")
    try:
        put = store.put_messages

        def go() -> None:
            for b in batches:
                put(b)
                dl.check()

        return _timed(n, go, store, dl)
    finally:
        close_store(store, path)


def pyspy_profile(root: Path, n: int, gil_only: bool, rate: int = 500) -> dict:
    raw = root / f"pyspy-{os.getpid()}.txt"
    wl_out = root / f"workload-{os.getpid()}.json"
    opts = ["--rate", str(rate), "--format", "raw", "--threads"] + (["--gil"] if gil_only else [])
    cmd = ["py-spy", "record", *opts, "-o", str(raw), "--", sys.executable, str(Path(__file__).resolve()),
           "--profile-workload", str(n), "--out", str(wl_out)]
    log("  " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0 or not wl_out.exists():
        raise RuntimeError(f"py-spy failed: {(proc.stdout + proc.stderr)[-800:]}")
    wl = json.loads(wl_out.read_text())
    wl_out.unlink()
    per_cat: dict[str, int] = defaultdict(int)
    per_thread: dict[str, int] = defaultdict(int)
    lines: dict[str, int] = defaultdict(int)
    waiting = total = 0
    try:
        text = raw.read_text()
    finally:
        raw.unlink(missing_ok=True)
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        c = int(count)
        thread, frames = frames[0], frames[1:]
        if not frames:
            continue
        if not gil_only and is_waiting(frames):
            waiting += c
            continue
        cat = categorise(frames)
        per_cat[cat] += c
        tname = thread.split(": ", 1)[1] if ": " in thread else "MainThread"
        per_thread[tname] += c
        total += c
        if not cat.startswith(("outside", "benchmark")):
            leaf = frames[-1]
            lines[f"{leaf}  | {_source_line(leaf)[:70]}"] += c

    def us(v: int) -> float:
        return round(v / rate / n * 1e6, 2)

    in_loop = {k: v for k, v in per_cat.items() if not k.startswith("outside")}
    groups: dict[str, int] = defaultdict(int)
    for k, v in in_loop.items():
        groups[k.split(":")[0]] += v
    return {
        "mode": "GIL-holding samples only (py-spy --gil)" if gil_only else
                "all threads, samples blocked in wait/sleep removed",
        "command": " ".join(["py-spy", "record", *opts, "-o", "<tmp>", "--", "python3",
                             "benchmarks/bench_store.py", "--profile-workload", str(n), "--out", "<tmp>"]),
        "rate_hz": rate, "workload": wl, "samples": total, "waiting_samples_dropped": waiting,
        "wall_us_per_msg": round(1e6 / wl["rate"], 2),
        "in_loop_us_per_msg": us(sum(in_loop.values())),
        "groups_us_per_msg": {k: us(v) for k, v in sorted(groups.items(), key=lambda kv: -kv[1])},
        "categories_us_per_msg": {k: us(v) for k, v in sorted(per_cat.items(), key=lambda kv: -kv[1])},
        "threads_us_per_msg": {k: us(v) for k, v in sorted(per_thread.items(), key=lambda kv: -kv[1])},
        "top_lines_us_per_msg": {k: us(v) for k, v in sorted(lines.items(), key=lambda kv: -kv[1])[:25]},
    }


def cprofile_profile(root: Path, n: int) -> dict:
    """Fallback without py-spy: cProfile in the main thread and the reput thread (its _run wrapped)."""
    from rmq_eventstore.store import StoreConfig

    msgs = make_messages(n, "p00-")
    batches = [msgs[i:i + 1000] for i in range(0, n, 1000)]
    path = tempfile.mkdtemp(prefix="profile-", dir=root)
    store = MessageStore(StoreConfig(store_path_root_dir=path))
    store.load()
    main_p, reput_p = cProfile.Profile(), cProfile.Profile()
    svc = store.reput_message_service
    orig = svc._run

    def profiled_run() -> None:
        reput_p.enable()
        try:
            orig()
        finally:
            reput_p.disable()

    svc._run = profiled_run
    store.start()
    dl = Deadline(900)
    try:
        t0 = time.perf_counter()
        main_p.enable()
        for b in batches:
            store.put_messages(b)
            dl.check()
        main_p.disable()
        wait_dispatched(store, dl)
        wait_complete(store, n, dl)
        elapsed = time.perf_counter() - t0
    finally:
        close_store(store, path)
    out: dict = {"mode": "cProfile (wall clock, main + reput thread)", "workload": {"n": n, "seconds": elapsed}}
    for name, prof in (("main", main_p), ("reput", reput_p)):
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        out[f"pstats_{name}"] = buf.getvalue()
    return out


def run_profile(args: argparse.Namespace, cfg: dict, root: Path, out_dir: Path) -> None:
    n = cfg["profile"]
    date = dt.date.today().isoformat()
    summary: dict = {"date": date, "n": n, "batch": 1000, "machine": machine_info(),
                     "loadavg_before": os.getloadavg()}
    if shutil.which("py-spy"):
        summary["gil"] = pyspy_profile(root, n, gil_only=True)
        summary["all_threads"] = pyspy_profile(root, n, gil_only=False)
    else:
        summary["cprofile"] = cprofile_profile(root, n)
    summary["loadavg_after"] = os.getloadavg()
    out_dir.mkdir(parents=True, exist_ok=True)
    p = out_dir / f"profile-{date}{'-quick' if args.quick else ''}.json"
    p.write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps({k: v for k, v in summary.items() if k != "machine"}, indent=2))
    log(f"wrote {p}")


# -- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"), help="directory for JSON and PNG")
    ap.add_argument("--reps", type=int, help="rounds of the throughput variants (default 5, quick 3)")
    ap.add_argument("--query-store", type=int, help="messages in the query-by-key store (default 5 M, quick 200 k)")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis comparisons")
    ap.add_argument("--max-seconds", type=float, default=1800, help="abort the run after this long")
    ap.add_argument("--only", choices=["throughput", "reads", "query", "memory"], action="append",
                    help="run only these phases (repeatable)")
    ap.add_argument("--profile", action="store_true", help="profile the batched put path instead")
    ap.add_argument("--profile-workload", type=int, metavar="N", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    cfg = dict(QUICK if args.quick else FULL)
    if args.reps:
        cfg["reps"] = args.reps
    if args.query_store:
        cfg["query_store"] = args.query_store
    root = REPO / "var" / "bench"
    root.mkdir(parents=True, exist_ok=True)
    out_dir = Path(args.out)

    if args.profile_workload:
        Path(args.out).write_text(json.dumps(profile_workload(root, args.profile_workload)))
        return 0
    if args.profile:
        run_profile(args, cfg, root, out_dir)
        return 0

    dl = Deadline(args.max_seconds)
    phases = args.only or ["throughput", "reads", "query", "memory"]
    with_redis = not args.no_redis
    rinfo = redis_info() if with_redis else {"available": False, "error": "--no-redis"}
    if with_redis and not rinfo["available"]:
        log(f"Redis not reachable on {REDIS_HOST}:{REDIS_PORT} ({rinfo['error']}); Redis comparisons skipped")
        with_redis = False
    machine = machine_info()
    machine["loadavg_before"] = os.getloadavg()
    machine["calibration_ns_before"] = calibration_ns()
    cpu0 = _cpu_times()
    t_start = time.perf_counter()
    results: dict = {"date": dt.date.today().isoformat(), "started": dt.datetime.now().isoformat(timespec="seconds"),
                     "quick": args.quick, "config": cfg, "machine": machine, "redis": rinfo,
                     "record_size": record_layout()[0], "body_size": BODY_SIZE, "queues": QUEUES}
    log(f"machine: {machine['nproc']} CPUs, load {machine['loadavg_before']}, "
        f"calibration {machine['calibration_ns_before']} ns; record loops: "
        f"{'native' if machine['native_codec'] else 'pure Python'}; redis: {rinfo}")
    sd = tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=root)
    sdir = Path(sd)
    try:
        if "throughput" in phases:
            log("phase 1: write throughput")
            results["throughput"] = phase_throughput(sdir, cfg, dl, with_redis)
        if "reads" in phases:
            log("phase 2: reads")
            results["reads"] = phase_reads(sdir, cfg, dl, with_redis)
        if "query" in phases:
            log("phase 3: query by key")
            results["query"] = phase_query(sdir, cfg, dl, with_redis)
        if "memory" in phases:
            log("phase 4: memory while appending")
            results["memory"] = phase_memory(sdir, cfg, dl)
    finally:
        shutil.rmtree(sdir, ignore_errors=True)
    machine["loadavg_after"] = os.getloadavg()
    machine["calibration_ns_after"] = calibration_ns()
    machine["cpu_during_run"] = cpu_usage(cpu0, _cpu_times())
    results["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    results["targets"] = targets(results)

    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    jp = out_dir / f"store-{results['date']}{suffix}.json"
    if "throughput" in results:
        results["charts"] = plot(results, out_dir, suffix)
        results["markdown"] = markdown(results)
    jp.write_text(json.dumps(results, indent=2) + "\n")
    if "markdown" in results:
        print(results["markdown"])
    log(f"wrote {jp} in {results['elapsed_s']} s; load avg after {machine['loadavg_after']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
