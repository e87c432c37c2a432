#!/usr/bin/env python3
"""Durable put throughput (SYNC_FLUSH group commit) side by side with one fdatasync per message, in ONE run.

    python benchmarks/bench_durability.py [--quick] [--out benchmarks/results] [--reps N] [--seconds S]

Variants, each with 1, 4 and 16 producer threads, every (variant, threads) cell repeated `--reps` times
interleaved, reported as the median with min/max:

* `sync`: `MessageStore.put_message` under SYNC_FLUSH: PUT_OK means the record was fdatasync'ed
  (GroupCommitService; puts per flush = answered requests / fdatasync calls).
* `sync_batch`: `put_messages` of 16 messages under SYNC_FLUSH (one wait per batch).
* `sync_pool`: SYNC_FLUSH with the transient store pool (write buffer + commit before the flush).
* `naive`: what a user would write instead: append the same record bytes to a plain file with `os.write`
  and call `os.fdatasync` after every message, from the same number of threads.
* `async`: ASYNC_FLUSH for reference (not durable at return).

Then the file-preparation × sync-call matrix: a 64 MiB segment prepared by ftruncate (sparse),
posix_fallocate or write() of zeros; 512-byte records appended through the mapping (and with pwrite),
each made durable by fdatasync, msync of the dirty page range (`mmap.flush(offset, size)`), or
sync_file_range (libc) + fdatasync; p50/p99 latency and ops/s of one thread.

Messages: 200-byte bodies, 4 queues of one topic, 64 MiB commitlog files. Stores and files live in a
temporary directory under `var/bench/` (the store's disk) and are deleted afterwards. Every loop is
bounded by time (`--seconds` per cell) and count. Results: `durability.json`, `durability.png`.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import datetime as dt
import json
import mmap
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tqdm import tqdm  # noqa: E402

from rmq_eventstore.store import Message, MessageStore, PutMessageStatus  # noqa: E402
from rmq_eventstore.store.flush import GroupCommitService  # noqa: E402

TOPIC = "DurableTopic"
BODY = b"d" * 200
THREADS = (1, 4, 16)
BATCH = 16
FILE_SIZE = 64 * 1024 * 1024
MAX_MSGS_PER_THREAD = 200_000


def _store_config(mode: str) -> dict:
    cfg: dict = {"mapped_file_size_commit_log": FILE_SIZE,
                 "flush_disk_type": "ASYNC_FLUSH" if mode == "async" else "SYNC_FLUSH"}
    if mode == "sync_pool":
        cfg.update(transient_store_pool_enable=True, transient_store_pool_size=2)
    return cfg


def run_store(base: Path, mode: str, threads: int, seconds: float) -> dict:
    """Producer threads putting for `seconds`; msgs/s, puts per flush and the statuses seen."""
    path = Path(tempfile.mkdtemp(dir=base, prefix=f"{mode}-{threads}-"))
    store = MessageStore.open(path, **_store_config(mode))
    counts = [0] * threads
    bad: list[str] = []
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def producer(t: int) -> None:
        msgs = [Message(topic=TOPIC, body=BODY, queue_id=(t + i) % 4) for i in range(BATCH)]
        start.wait()
        n = 0
        while not stop.is_set() and n < MAX_MSGS_PER_THREAD:
            if mode == "sync_batch":
                r = store.put_messages(msgs)
                k = BATCH
            else:
                r = store.put_message(msgs[n % BATCH])
                k = 1
            if r.status != PutMessageStatus.PUT_OK:
                bad.append(r.status.name)
                break
            n += k
        counts[t] = n

    ws = [threading.Thread(target=producer, args=(t,)) for t in range(threads)]
    for w in ws:
        w.start()
    gcs = store.flush_commit_log_service
    req0 = gcs.request_count if isinstance(gcs, GroupCommitService) else 0
    fl0 = gcs.flush_count if gcs is not None else 0
    start.wait()
    t0 = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for w in ws:
        w.join()
    elapsed = time.perf_counter() - t0
    total = sum(counts)
    out = {"msgs": total, "seconds": elapsed, "msgs_per_s": total / elapsed, "errors": bad[:3]}
    if isinstance(gcs, GroupCommitService):
        reqs, flushes = gcs.request_count - req0, gcs.flush_count - fl0
        out.update(requests=reqs, flushes=flushes, puts_per_flush=reqs / flushes if flushes else 0.0,
                   msgs_per_flush=total / flushes if flushes else 0.0)
    store.shutdown()
    shutil.rmtree(path, ignore_errors=True)
    return out


def run_naive(base: Path, threads: int, seconds: float, record_size: int) -> dict:
    """One os.write + os.fdatasync per message on a plain append-only file, `threads` writers."""
    path = base / f"naive-{threads}.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
    rec = b"r" * record_size
    counts = [0] * threads
    stop = threading.Event()
    start = threading.Barrier(threads + 1)

    def writer(t: int) -> None:
        start.wait()
        n = 0
        while not stop.is_set() and n < MAX_MSGS_PER_THREAD:
            os.write(fd, rec)
            os.fdatasync(fd)
            n += 1
        counts[t] = n

    ws = [threading.Thread(target=writer, args=(t,)) for t in range(threads)]
    for w in ws:
        w.start()
    start.wait()
    t0 = time.perf_counter()
    stop.wait(seconds)
    stop.set()
    for w in ws:
        w.join()
    elapsed = time.perf_counter() - t0
    os.close(fd)
    os.unlink(path)
    total = sum(counts)
    return {"msgs": total, "seconds": elapsed, "msgs_per_s": total / elapsed}


# -- file preparation x sync call --------------------------------------------------------------------
# CPython's os module has no sync_file_range: call libc (ctypes releases the GIL during the call).
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_sync_file_range = _libc.sync_file_range
_sync_file_range.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
_sync_file_range.restype = ctypes.c_int
PREPS = ("ftruncate", "posix_fallocate", "write_zeros")
SYNCS = ("mmap+fdatasync", "mmap+msync_range", "mmap+sync_file_range+fdatasync", "pwrite+fdatasync")


def _prepare(path: Path, prep: str) -> int:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    if prep == "ftruncate":
        os.ftruncate(fd, FILE_SIZE)
    elif prep == "posix_fallocate":
        os.posix_fallocate(fd, 0, FILE_SIZE)
    else:
        chunk = bytes(1 << 20)
        for _ in range(FILE_SIZE // len(chunk)):
            os.write(fd, chunk)
    os.fsync(fd)
    return fd


def run_matrix_cell(base: Path, prep: str, sync: str, iterations: int, record: int = 512) -> dict:
    path = base / f"seg-{prep}"
    fd = _prepare(path, prep)
    mm = mmap.mmap(fd, FILE_SIZE, access=mmap.ACCESS_WRITE)
    data = b"m" * record
    lat = []
    pos = 0
    page = mmap.PAGESIZE
    flags = 1 | 2 | 4  # SYNC_FILE_RANGE_WAIT_BEFORE | WRITE | WAIT_AFTER
    t_all = time.perf_counter()
    for _ in range(iterations):
        t = time.perf_counter()
        if sync == "pwrite+fdatasync":
            os.pwrite(fd, data, pos)
        else:
            mm[pos:pos + record] = data
        start = pos - pos % page
        end = pos + record
        if sync in ("mmap+fdatasync", "pwrite+fdatasync"):
            os.fdatasync(fd)
        elif sync == "mmap+msync_range":
            mm.flush(start, end - start)
        else:
            if _sync_file_range(fd, start, end - start, flags) != 0:
                raise OSError(ctypes.get_errno(), "sync_file_range failed")
            os.fdatasync(fd)
        lat.append(time.perf_counter() - t)
        pos = end
    total = time.perf_counter() - t_all
    mm.close()
    os.close(fd)
    os.unlink(path)
    lat.sort()
    return {"p50_us": lat[len(lat) // 2] * 1e6, "p99_us": lat[int(len(lat) * 0.99)] * 1e6,
            "ops_per_s": iterations / total}


# -- driver -----------------------------------------------------------------------------------------
def _med(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="1 repetition, 1 s cells, 300-iteration matrix")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=2.0, help="duration of one throughput cell")
    ap.add_argument("--iterations", type=int, default=1000, help="appends per matrix cell")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    args = ap.parse_args()
    if args.quick:
        args.reps, args.seconds, args.iterations = 1, 1.0, 300
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (REPO / "var" / "bench").mkdir(parents=True, exist_ok=True)
    base = Path(tempfile.mkdtemp(dir=REPO / "var" / "bench", prefix="durability-"))
    # the record the store writes for these messages (header + topic + properties + body)
    probe_dir = Path(tempfile.mkdtemp(dir=base))
    with MessageStore.open(probe_dir, mapped_file_size_commit_log=FILE_SIZE) as s:
        record_size = s.put_message(Message(topic=TOPIC, body=BODY)).append_result.wrote_bytes
    shutil.rmtree(probe_dir)
    modes = ("sync", "naive", "sync_batch", "sync_pool", "async")
    raw: dict[str, dict[int, list[dict]]] = {m: {t: [] for t in THREADS} for m in modes}
    cells = [(m, t) for t in THREADS for m in modes]
    matrix: dict[str, dict[str, list[dict]]] = {p: {s: [] for s in SYNCS} for p in PREPS}
    try:
        with tqdm(total=args.reps * (len(cells) + len(PREPS) * len(SYNCS)), desc="durability") as bar:
            for rep in range(args.reps):
                order = cells[rep % len(cells):] + cells[:rep % len(cells)]
                for mode, threads in order:
                    bar.set_postfix_str(f"{mode} x{threads}")
                    if mode == "naive":
                        raw[mode][threads].append(run_naive(base, threads, args.seconds, record_size))
                    else:
                        raw[mode][threads].append(run_store(base, mode, threads, args.seconds))
                    bar.update()
                for prep in PREPS:
                    for sync in SYNCS:
                        bar.set_postfix_str(f"{prep} / {sync}")
                        matrix[prep][sync].append(run_matrix_cell(base, prep, sync, args.iterations))
                        bar.update()
    finally:
        shutil.rmtree(base, ignore_errors=True)

    results: dict = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "quick": args.quick, "reps": args.reps, "seconds_per_cell": args.seconds,
        "record_bytes": record_size,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "kernel": platform.release()},
        "throughput": {}, "ratios_vs_naive": {}, "matrix": {},
    }
    for mode in modes:
        results["throughput"][mode] = {}
        for t in THREADS:
            runs = raw[mode][t]
            cell = {"msgs_per_s": _med([r["msgs_per_s"] for r in runs]), "runs": runs}
            if "puts_per_flush" in runs[0]:
                cell["puts_per_flush"] = _med([r["puts_per_flush"] for r in runs])
                cell["msgs_per_flush"] = _med([r["msgs_per_flush"] for r in runs])
            results["throughput"][mode][str(t)] = cell
    for mode in ("sync", "sync_batch", "sync_pool", "async"):
        results["ratios_vs_naive"][mode] = {
            str(t): statistics.median(a["msgs_per_s"] / b["msgs_per_s"]
                                      for a, b in zip(raw[mode][t], raw["naive"][t], strict=True))
            for t in THREADS}
    for prep in PREPS:
        results["matrix"][prep] = {
            s: {k: statistics.median(r[k] for r in matrix[prep][s]) for k in ("p50_us", "p99_us", "ops_per_s")}
            for s in SYNCS}
    suffix = "-quick" if args.quick else ""
    (out_dir / f"durability{suffix}.json").write_text(json.dumps(results, indent=2) + "\n")
    plot(results, out_dir / f"durability{suffix}.png")
    print(markdown(results))


def plot(results: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    labels = {"sync": "SYNC_FLUSH put_message (group commit)", "sync_batch": f"SYNC_FLUSH put_messages x{BATCH}",
              "sync_pool": "SYNC_FLUSH + transient pool", "naive": "write + fdatasync per message",
              "async": "ASYNC_FLUSH (reference, not durable at return)"}
    width = 0.16
    for i, mode in enumerate(labels):
        ys = [results["throughput"][mode][str(t)]["msgs_per_s"]["median"] for t in THREADS]
        xs = [j + (i - 2) * width for j in range(len(THREADS))]
        ax1.bar(xs, ys, width, label=labels[mode])
    ax1.set_xticks(range(len(THREADS)), [f"{t} thread{'s' if t > 1 else ''}" for t in THREADS])
    ax1.set_yscale("log")
    ax1.set_ylabel("messages/s (log)")
    ax1.set_title("durable put throughput")
    ax1.legend(fontsize=7)
    preps = list(results["matrix"])
    syncs = list(results["matrix"][preps[0]])
    for i, s in enumerate(syncs):
        ys = [results["matrix"][p][s]["p50_us"] for p in preps]
        ax2.bar([j + (i - 1.5) * 0.2 for j in range(len(preps))], ys, 0.2, label=s)
    ax2.set_xticks(range(len(preps)), preps)
    ax2.set_yscale("log")
    ax2.set_ylabel("p50 latency of one durable 512 B append, µs (log)")
    ax2.set_title("file preparation x sync call")
    ax2.legend(fontsize=7)
    m = results["machine"]
    fig.suptitle(f"rmq_eventstore durability - {results['date']} - {m['cpus']} CPUs, Linux {m['kernel']}, "
                 f"Python {m['python']}{' (--quick)' if results['quick'] else ''}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def markdown(results: dict) -> str:
    lines = ["| variant | " + " | ".join(f"{t} thr msgs/s" for t in THREADS) + " | ratio vs naive @16 |",
             "|---|" + "---:|" * (len(THREADS) + 1)]
    for mode, cells in results["throughput"].items():
        vals = []
        for t in THREADS:
            c = cells[str(t)]
            v = f"{c['msgs_per_s']['median']:,.0f}"
            if "puts_per_flush" in c:
                v += f" ({c['puts_per_flush']['median']:.1f} puts"
                if mode == "sync_batch":
                    v += f", {c['msgs_per_flush']['median']:.0f} msgs"
                v += "/flush)"
            vals.append(v)
        ratio = results["ratios_vs_naive"].get(mode, {}).get("16")
        lines.append(f"| {mode} | " + " | ".join(vals) + f" | {ratio:.1f}x |" if ratio else
                     f"| {mode} | " + " | ".join(vals) + " | 1.0x |")
    lines += ["", "| prep \\ sync (p50 µs / p99 µs / ops/s) | " + " | ".join(SYNCS) + " |",
              "|---|" + "---|" * len(SYNCS)]
    for p, row in results["matrix"].items():
        lines.append(f"| {p} | " + " | ".join(
            f"{row[s]['p50_us']:.0f} / {row[s]['p99_us']:.0f} / {row[s]['ops_per_s']:,.0f}" for s in SYNCS) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
