"""Recovery benchmark: restart time after a clean shutdown, and abnormal recovery speed per MB of tail.

Side by side in one run, on the same stores:

* clean restart (`MessageStore.load`, which verifies the end recorded at shutdown) for a small and a
  multi-GiB store, against RocketMQ's normal recovery (a CRC scan of the last three commitlog files,
  `CommitLog.recover_normally`) on the multi-GiB store;
* abnormal recovery (the `abort` file left behind, the checkpoint vouching for everything before the
  last commitlog file): MB/s of tail walked, against the previous approach (every record of the same
  tail parsed back by the reput service, the dispatchers skipping what they hold);
* rebuilding the consume queues and index of the small store from its commitlog (`rebuild`), MB/s;
* `verify` (read-only: every record's CRC, every consume queue unit and index entry) of the multi-GiB
  store: MB/s of commitlog, CPU seconds, and peak memory split into anonymous memory (what verify itself
  holds) and mapped file pages (the store's files in the page cache, counted in RSS while mapped).

The multi-GiB store is built once with large batched puts (RocketMQ's default geometry: 1 GiB commitlog
files) under `var/bench/recovery-<size>/` and reused by later runs (delete it to rebuild). Page cache
is warm (the stores were just written or read); nothing is dropped from the OS cache.

Usage: `python benchmarks/bench_recovery.py [--big-gib 3] [--small-mib 64] [--reps 5] [--out DIR]`.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rmq_eventstore.common import codec  # noqa: E402
from rmq_eventstore.store import Message, MessageStore  # noqa: E402
from rmq_eventstore.store.checkpoint import StoreCheckpoint  # noqa: E402
from rmq_eventstore.store.commitlog import CommitLog  # noqa: E402
from rmq_eventstore.store.config import StoreConfig  # noqa: E402
from rmq_eventstore.store.repair import rebuild, recover, verify  # noqa: E402

BODY = 1024  # records of ~1.2 KB
BATCH = 256
TOPICS = ("BenchOrders", "BenchPayments", "BenchAudit")
QUEUES = 4


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build(path: Path, total_bytes: int, config: dict) -> dict:
    """Fill a store with ~total_bytes of commitlog in batches; returns what was written."""
    marker = path / "bench-built.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info.get("total_bytes") == total_bytes:
            log(f"reusing {path} ({info['commit_log_bytes'] / 2**20:.0f} MiB, {info['messages']} messages)")
            return info
    shutil.rmtree(path, ignore_errors=True)
    t0 = time.perf_counter()
    store = MessageStore.open(path, **config)
    body = os.urandom(BODY)
    n = 0
    last_report = 0
    try:
        while store.get_max_phy_offset() < total_bytes:
            topic = TOPICS[n // BATCH % len(TOPICS)]
            msgs = [Message(topic=topic, body=body, queue_id=(n + i) % QUEUES, keys=[f"k{n + i}"], tags="T")
                    for i in range(BATCH)]
            r = store.put_messages(msgs)
            assert r.is_ok(), r
            n += BATCH
            if store.get_max_phy_offset() - last_report >= 256 << 20:
                last_report = store.get_max_phy_offset()
                log(f"  built {last_report / 2**20:.0f} MiB")
        store.wait_for_dispatch(600)
    finally:
        store.shutdown()
    info = {"total_bytes": total_bytes, "messages": n, "commit_log_bytes": None,
            "build_seconds": round(time.perf_counter() - t0, 1)}
    s = MessageStore(StoreConfig(store_path_root_dir=str(path), **config))
    s.load()
    info["commit_log_bytes"] = s.get_max_phy_offset()
    s.shutdown()
    marker.write_text(json.dumps(info))
    log(f"built {path}: {info}")
    return info


def clean_restart(path: Path, config: dict, reps: int) -> dict:
    times = []
    report = None
    for _ in range(reps):
        s = MessageStore(StoreConfig(store_path_root_dir=str(path), **config))
        t0 = time.perf_counter()
        s.load()
        times.append(time.perf_counter() - t0)
        report = s.recovery_report
        s.shutdown()
    return {"seconds_median": statistics.median(times), "seconds_max": max(times), "mode": report.mode,
            "bytes_scanned": report.bytes_scanned, "commit_log_end": report.commit_log_end}


def rocketmq_normal_scan(path: Path, config: dict) -> dict:
    """RocketMQ's recoverNormally: CRC-check every record of the last three commitlog files."""
    cfg = StoreConfig(store_path_root_dir=str(path), **config)
    cl = CommitLog(cfg)
    cl.load()
    files = cl.mapped_file_queue.mapped_files
    start = files[max(0, len(files) - 3)].file_from_offset
    t0 = time.perf_counter()
    end = cl.recover_normally(True)
    dt = time.perf_counter() - t0
    cl.shutdown()
    return {"seconds": dt, "bytes_scanned": end - start, "mb_per_s": (end - start) / dt / 1e6}


def _vouch_for_all_but_last_files(path: Path, config: dict, files: int = 2) -> int:
    """Checkpoint times as a running broker leaves them: everything before the last `files` commitlog
    files is flushed (the tail is then at least one full 1 GiB file). Returns where the tail starts."""
    seg = sorted((path / "commitlog").iterdir())[-files]
    with open(seg, "rb") as f:
        head = f.read(64)
    first_ts = struct.unpack_from(">q", head, 56)[0]
    cp = StoreCheckpoint(str(path / "checkpoint"))
    cp.physic_msg_timestamp = cp.logics_msg_timestamp = first_ts + 3000
    cp.shutdown()
    return int(seg.name)


def abnormal(path: Path, config: dict, reps: int, record_size: float) -> dict:
    rows = []
    old_rows = []
    for _ in range(reps):
        last_file = _vouch_for_all_but_last_files(path, config)
        (path / "abort").write_text("1")
        s = MessageStore(StoreConfig(store_path_root_dir=str(path), **config))
        t0 = time.perf_counter()
        s.load()
        dt = time.perf_counter() - t0
        rep = s.recovery_report
        assert rep.mode == "abnormal" and rep.scan_start == last_file, rep
        rows.append((dt, rep.bytes_scanned))
        # the previous approach on the same tail: the reput service parses every record back
        rs = s.reput_message_service
        rs.reput_from_offset = rs.dispatched_offset = rep.scan_start
        t0 = time.perf_counter()
        while rs.do_reput():
            pass
        old_rows.append((time.perf_counter() - t0, rep.commit_log_end - rep.scan_start))
        s.shutdown()
        (path / "abort").unlink()  # recovered and flushed: the next run starts from a clean shutdown
    dt = statistics.median(r[0] for r in rows)
    tail = rows[0][1]
    odt = statistics.median(r[0] for r in old_rows)
    return {"seconds_median": dt, "tail_bytes": tail, "mb_per_s": tail / dt / 1e6,
            "us_per_record": dt / (tail / record_size) * 1e6,
            "reput_parse_seconds_median": odt, "reput_parse_mb_per_s": old_rows[0][1] / odt / 1e6}


def rebuild_speed(path: Path, config: dict) -> dict:
    t0 = time.perf_counter()
    r = rebuild(path, None, **config)
    dt = time.perf_counter() - t0
    size = r.recovery["commit_log_end"]
    return {"seconds": dt, "bytes": size, "mb_per_s": size / dt / 1e6, "units": r.units,
            "index_entries": r.index_entries}


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def verify_speed(path: Path, reps: int) -> dict:
    """`verify` of a whole store: median wall and CPU seconds, MB/s of commitlog, and the peak of
    anonymous memory (RssAnon, sampled every 10 ms) beside the peak of all RSS (VmHWM, which includes the
    mapped store files)."""
    import threading

    rows = []
    peak_anon = 0
    report = None
    for _ in range(reps):
        base_anon = _status_kib("RssAnon")
        stop = threading.Event()
        seen = [0]

        def sample(stop: threading.Event = stop, seen: list[int] = seen) -> None:
            while not stop.wait(0.01):
                seen[0] = max(seen[0], _status_kib("RssAnon"))

        t = threading.Thread(target=sample, daemon=True)
        t.start()
        c0, t0 = time.process_time(), time.perf_counter()
        report = verify(path)
        rows.append((time.perf_counter() - t0, time.process_time() - c0))
        stop.set()
        t.join()
        peak_anon = max(peak_anon, seen[0] - base_anon)
        assert report.ok, report.problems[:5]
    wall = statistics.median(r[0] for r in rows)
    cpu = statistics.median(r[1] for r in rows)
    size = report.commit_log_bytes
    return {"native": hasattr(codec.native, "verify_scan"), "seconds_median": wall, "cpu_seconds_median": cpu,
            "bytes": size, "mb_per_s": size / wall / 1e6, "mb_per_s_cpu": size / cpu / 1e6,
            "records": report.records, "units": report.units, "index_entries": report.index_entries,
            "rss_anon_growth_peak_mib": peak_anon / 1024, "vm_hwm_mib": _status_kib("VmHWM") / 1024}


def plot(results: dict, out: Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("matplotlib missing: no plot")
        return
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    labels = [f"clean restart\nsmall ({results['small']['commit_log_bytes'] / 2**20:.0f} MiB)",
              f"clean restart\nbig ({results['big']['commit_log_bytes'] / 2**30:.1f} GiB)",
              "RocketMQ scan of\nlast 3 files (big)"]
    vals = [results["clean_small"]["seconds_median"], results["clean_big"]["seconds_median"],
            results["rocketmq_normal_scan_big"]["seconds"]]
    a.bar(labels, vals, color=["tab:green", "tab:green", "tab:gray"])
    a.axhline(1.0, color="tab:red", ls="--", lw=1, label="target 1 s")
    a.set_yscale("log")
    a.set_ylabel("seconds (log)")
    a.set_title("restart after a clean shutdown")
    a.legend()
    ab = results["abnormal_big"]
    b.bar(["skim + dispatch\nwhat is missing", "reput parses\nevery record", "rebuild\n(small store)",
           "verify\n(big store)"],
          [ab["mb_per_s"], ab["reput_parse_mb_per_s"], results["rebuild_small"]["mb_per_s"],
           results["verify_big"]["mb_per_s"]],
          color=["tab:green", "tab:gray", "tab:blue", "tab:purple"])
    b.axhline(300, color="tab:red", ls="--", lw=1, label="target 300 MB/s")
    b.set_ylabel("MB/s of commitlog (tail, or all for verify)")
    b.set_title("abnormal recovery (tail of 1 GiB+) and verify")
    b.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    log(f"wrote {out}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--big-gib", type=float, default=3.0)
    p.add_argument("--small-mib", type=float, default=64.0)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    p.add_argument("--var", default=str(ROOT / "var" / "bench"))
    args = p.parse_args()
    config: dict = {"flush_disk_type": "ASYNC_FLUSH"}  # RocketMQ's default geometry
    var = Path(args.var)
    var.mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    small = var / f"recovery-{int(args.small_mib)}m"
    big = var / f"recovery-{args.big_gib:g}g"
    results: dict = {"machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                                 "platform": platform.platform()},
                     "date": time.strftime("%Y-%m-%d %H:%M:%S"), "page_cache": "warm"}
    results["small"] = build(small, int(args.small_mib * 2**20), config)
    results["big"] = build(big, int(args.big_gib * 2**30), config)
    for path in (small, big):
        if (path / "abort").exists():  # an interrupted earlier run: recover it first
            recover(path, None, **config)
    log("clean restarts ...")
    results["clean_small"] = clean_restart(small, config, args.reps)
    results["clean_big"] = clean_restart(big, config, args.reps)
    log("RocketMQ-style normal scan ...")
    results["rocketmq_normal_scan_big"] = rocketmq_normal_scan(big, config)
    # the scan truncated nothing (the store is intact), but it left the checkpoint as it was: restore
    # a clean restart state
    clean_restart(big, config, 1)
    log("abnormal recovery ...")
    record_size = results["big"]["commit_log_bytes"] / results["big"]["messages"]
    results["record_size"] = round(record_size, 1)
    results["abnormal_big"] = abnormal(big, config, max(1, args.reps // 2), record_size)
    log("rebuild ...")
    results["rebuild_small"] = rebuild_speed(small, config)
    log("verify ...")
    results["verify_big"] = verify_speed(big, max(1, args.reps // 2))
    clean_restart(big, config, 1)  # leave both stores cleanly shut down for the next run
    stamp = time.strftime("%Y-%m-%d")
    (out / f"recovery-{stamp}.json").write_text(json.dumps(results, indent=2))
    plot(results, out / "recovery.png")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
