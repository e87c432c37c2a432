"""Throughput against batch size and message size: the embedded store beside Redis Streams, in ONE run.

    python benchmarks/bench_sweep.py [--quick] [--out benchmarks/results] [--no-redis]

For every body size (64 B .. 16 KiB) and batch size (1, 10, 100, 1000) it appends messages to a fresh
store (one key each, 4 queues, ASYNC flush, default StoreConfig; batch 1 = `put_message`, else
`put_messages`) and stops the clock when every message is dispatched (consume queues and index checked),
then does the same with Redis `XADD` (batch 1 = one call per entry, else a non-transactional pipeline of
that many). The points alternate ours / Redis so drift hits both alike. Output: `sweep-<date>.json` with
every point, and `sweep.png`: messages/s against batch size (one line per body size) and MB/s of payload
against body size at the largest batch. Stores go under `var/bench/` and are deleted; Redis keys are
`bench:sweep:<pid>:*` and are deleted. Only 127.0.0.1 is contacted; each point has a fixed count.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rmq_eventstore.store import Message, MessageStore, PutMessageStatus  # noqa: E402

TOPIC = "SweepTopic"
QUEUES = 4
BODY_SIZES = (64, 256, 1024, 4096, 16384)
BATCHES = (1, 10, 100, 1000)


def log(*a: object) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, file=sys.stderr, flush=True)


def count_for(body: int, batch: int, quick: bool) -> int:
    """Messages per point: bounded by count and by bytes, a whole number of batches."""
    cap = 20_000 if batch == 1 else 100_000
    n = min(cap, (64 << 20) // body)
    if quick:
        n //= 4
    return max(batch, n // batch * batch)


def run_ours(root: Path, bodies: list[bytes], n: int, batch: int) -> dict:
    msgs = [Message(topic=TOPIC, body=bodies[i % len(bodies)], keys=f"k{i:010d}", queue_id=i % QUEUES)
            for i in range(n)]
    path = tempfile.mkdtemp(prefix="sweep-", dir=root)
    store = MessageStore.open(path)
    try:
        ok = PutMessageStatus.PUT_OK
        c0, t0 = time.process_time(), time.perf_counter()
        if batch == 1:
            put = store.put_message
            for m in msgs:
                if put(m).status is not ok:
                    raise RuntimeError("put failed")
        else:
            put_many = store.put_messages
            for i in range(0, n, batch):
                if put_many(msgs[i:i + batch]).status is not ok:
                    raise RuntimeError("put failed")
        for _ in range(600):
            if store.wait_for_dispatch(timeout=1.0):
                break
        deadline = time.monotonic() + 60
        while (sum(store.get_max_offset_in_queue(TOPIC, q) for q in range(QUEUES)) < n
               or store.index_service.get_total_entries() < 2 * n):
            if time.monotonic() > deadline:
                raise RuntimeError("dispatch did not complete")
            time.sleep(0.0002)
        t1, c1 = time.perf_counter(), time.process_time()
        return {"n": n, "rate": n / (t1 - t0), "cpu_rate": n / max(c1 - c0, 1e-9)}
    finally:
        store.shutdown()
        shutil.rmtree(path, ignore_errors=True)


def run_redis(r, bodies: list[bytes], n: int, batch: int, tag: str) -> dict:
    stream = f"bench:sweep:{os.getpid()}:{tag}"
    r.delete(stream)
    fields = [{"d": bodies[i % len(bodies)], "k": f"k{i:010d}"} for i in range(n)]
    try:
        c0, t0 = time.process_time(), time.perf_counter()
        if batch == 1:
            xadd = r.xadd
            for f in fields:
                xadd(stream, f)
        else:
            for i in range(0, n, batch):
                pipe = r.pipeline(transaction=False)
                for f in fields[i:i + batch]:
                    pipe.xadd(stream, f)
                pipe.execute()
        t1, c1 = time.perf_counter(), time.process_time()
        if r.xlen(stream) != n:
            raise AssertionError("XLEN mismatch")
        return {"n": n, "rate": n / (t1 - t0), "cpu_rate": n / max(c1 - c0, 1e-9)}
    finally:
        r.delete(stream)


def plot(result: dict, out: Path) -> Path | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    pts = result["points"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ci, body in enumerate(result["body_sizes"]):
        for peer, style in (("ours", "-o"), ("redis", "--x")):
            xs = [p["batch"] for p in pts if p["body"] == body and peer in p]
            ys = [p[peer]["rate"] for p in pts if p["body"] == body and peer in p]
            if xs:
                a1.plot(xs, ys, style, color=colors[ci % len(colors)],
                        label=f"{'store' if peer == 'ours' else 'Redis'} {body} B")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("batch size (messages per call / pipeline)")
    a1.set_ylabel("messages/s (dispatch included for the store)")
    a1.set_title("Throughput against batch size")
    a1.legend(fontsize=7, ncol=2)
    a1.grid(True, which="both", alpha=0.3)
    top = max(result["batches"])
    for peer, style in (("ours", "-o"), ("redis", "--x")):
        xs = [p["body"] for p in pts if p["batch"] == top and peer in p]
        ys = [p[peer]["rate"] * p["body"] / 1e6 for p in pts if p["batch"] == top and peer in p]
        if xs:
            a2.plot(xs, ys, style, label=f"{'store' if peer == 'ours' else 'Redis'}, batch {top}")
    bounds = result.get("bounds", {})
    if bounds.get("disk_write_mb_s"):
        a2.axhline(bounds["disk_write_mb_s"], color="grey", ls=":", label="disk sequential write (fdatasync'd)")
    a2.set_xscale("log")
    a2.set_xlabel("body size (bytes)")
    a2.set_ylabel("payload MB/s")
    a2.set_title("Payload rate against message size")
    a2.legend(fontsize=8)
    a2.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"bench_sweep.py {result['date']} (load {result['loadavg_before'][0]:.1f} → "
                 f"{result['loadavg_after'][0]:.1f})", fontsize=9)
    fig.tight_layout()
    path = out / "sweep.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def disk_write_mb_s(root: Path, mib: int = 256) -> float:
    """Sequential write of `mib` MiB in 4 MiB writes, then one fdatasync: the disk's bound for a store."""
    buf = os.urandom(4 << 20)
    fd, path = tempfile.mkstemp(dir=root)
    try:
        t0 = time.perf_counter()
        for _ in range(mib // 4):
            os.write(fd, buf)
        os.fdatasync(fd)
        return mib * 1.048576 / (time.perf_counter() - t0)
    finally:
        os.close(fd)
        os.unlink(path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a quarter of the messages per point")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "results"))
    ap.add_argument("--no-redis", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    root = REPO / "var" / "bench"
    root.mkdir(parents=True, exist_ok=True)
    r = None
    if not args.no_redis:
        try:
            import redis

            r = redis.Redis(host="127.0.0.1", port=6379, socket_timeout=30)
            r.ping()
        except Exception as e:  # noqa: BLE001 - reported; the store half still runs
            log(f"Redis not reachable ({e!r}): store only")
            r = None
    rng = random.Random(20261125)
    result: dict = {"date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                    "quick": args.quick, "loadavg_before": list(os.getloadavg()), "body_sizes": list(BODY_SIZES),
                    "batches": list(BATCHES), "points": [], "redis": r is not None}
    result["bounds"] = {"disk_write_mb_s": round(disk_write_mb_s(root), 1)}
    total = len(BODY_SIZES) * len(BATCHES)
    t_start = time.perf_counter()
    for i, body in enumerate(BODY_SIZES):
        bodies = [rng.randbytes(body) for _ in range(64)]
        for j, batch in enumerate(BATCHES):
            n = count_for(body, batch, args.quick)
            point: dict = {"body": body, "batch": batch, "n": n}
            order = ("ours", "redis") if (i + j) % 2 == 0 else ("redis", "ours")
            for peer in order:
                if peer == "ours":
                    point["ours"] = run_ours(root, bodies, n, batch)
                elif r is not None:
                    point["redis"] = run_redis(r, bodies, n, min(batch, 1000), f"{body}-{batch}")
            if "redis" in point:
                point["ratio"] = round(point["ours"]["rate"] / point["redis"]["rate"], 2)
            result["points"].append(point)
            k = i * len(BATCHES) + j + 1
            log(f"[{k}/{total}] body {body:>5} B batch {batch:>4}: store {point['ours']['rate']:>10,.0f}/s"
                + (f"  Redis {point['redis']['rate']:>9,.0f}/s  ratio {point['ratio']}" if "redis" in point else "")
                + f"  ({time.perf_counter() - t_start:.0f} s)")
    result["loadavg_after"] = list(os.getloadavg())
    suffix = "-quick" if args.quick else ""
    path = out / f"sweep-{dt.date.today().isoformat()}{suffix}.json"
    path.write_text(json.dumps(result, indent=1))
    png = plot(result, out)
    log(f"wrote {path}" + (f" and {png}" if png else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
