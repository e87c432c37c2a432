"""Timer messages: how late they arrive, and what a million pending timers cost in memory.

    python benchmarks/bench_timer.py [--quick] [--timers N] [--window S] [--pending M] [--out DIR]

1. Lateness through the broker: `rmq-eventstore serve` in a child process (RocketMQ's default
   `timerPrecisionMs` 1000), N timers sent by our `Producer` with delivery times spread evenly over a window of
   S seconds, a long-polling `PullConsumer` receiving them; lateness = arrival - requested delivery time.
   Goal (issue): p99 <= precision + 50 ms. Full run: 100,000 timers over 60 s; `--quick`: 10,000 over 10 s.
2. Memory with pending timers: an embedded `Broker` files M timers due in an hour; the process's anonymous
   resident memory (RssAnon: heap, what Python objects cost) and its whole RSS (with the store's mapped
   file pages) are read from /proc after every quarter, and the timer-log size reported (52 bytes a timer). Full: 1,000,000;
   `--quick`: 100,000.

Stores live under `var/bench/` and are deleted afterwards; only 127.0.0.1 is used; every loop is bounded.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import broker_process  # noqa: E402

from rmq_eventstore.broker import Broker  # noqa: E402
from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer  # noqa: E402
from rmq_eventstore.store import MessageStore  # noqa: E402


def rss_mib(pid: int | str = "self", field: str = "RssAnon") -> float:
    """Resident memory from /proc: `RssAnon` (the process's own heap and stacks: what Python objects
    cost) by default; `VmRSS` also counts the store's memory-mapped file pages, which the kernel can drop."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def lateness(tmp: Path, n: int, window: float) -> dict:
    arrivals: dict[int, float] = {}
    stop = threading.Event()

    def consume() -> None:
        with PullConsumer(ns, "bench-timer") as c:
            offsets = [0, 0, 0, 0]
            while not stop.is_set() and len(arrivals) < n:
                for q in range(4):
                    r = c.pull("timers", q, offsets[q], max_nums=256, suspend_timeout_ms=200)
                    now = time.time()
                    if r.status == FOUND:
                        for m in r.messages:
                            arrivals[int(bytes(m.body))] = now
                        offsets[q] = r.next_begin_offset

    with broker_process(tmp / "broker") as (proc, ns):
        with Producer(ns, "bench-timer") as p:
            p.send(Message("timers", b"-1"))  # creates the topic; its queues exist before the consumer starts
            consumer = threading.Thread(target=consume, daemon=True)
            consumer.start()
            t_send = time.time()
            base = t_send + n / 1500 + 3  # every send done before the first delivery (>= 1,500 sends/s)
            due = [base + window * i / n for i in range(n)]
            for i, d in enumerate(due):
                p.send(Message("timers", str(i).encode()), deliver_at=int(d * 1000))
            send_s = time.time() - t_send
            deadline = time.time() + (base - time.time()) + window + 30
            while len(arrivals) < n + 1 and time.time() < deadline:
                time.sleep(0.2)
            rss = rss_mib(proc.pid)
        stop.set()
        consumer.join(10)
    late = [(arrivals[i] - due[i]) * 1000 for i in range(n) if i in arrivals]
    return {"timers": n, "window_s": window, "send_s": round(send_s, 1), "received": len(late),
            "lost": n - len(late), "lateness_ms": {"p50": percentile(late, 50), "p99": percentile(late, 99),
                                                   "max": max(late), "min": min(late),
                                                   "mean": statistics.mean(late)},
            "broker_rss_mib_after": round(rss, 1)}


def pending_memory(tmp: Path, m: int) -> dict:
    rows = []
    with MessageStore.open(tmp / "embedded") as store:
        b = Broker(store)
        b.start()
        try:
            rows.append((0, rss_mib(), rss_mib(field="VmRSS")))
            step = m // 4
            for k in range(4):
                for _ in range(step):
                    b.send_messages([Message("later", b"x" * 100, queue_id=0,
                                             properties_string=f"TIMER_DELIVER_MS\x01{int(time.time() * 1000) + 3_600_000}\x02")])
                store.wait_for_dispatch(60)
                deadline = time.time() + 120
                while b.timer_store.pending_hint() and time.time() < deadline:
                    time.sleep(0.05)
                rows.append(((k + 1) * step, rss_mib(), rss_mib(field="VmRSS")))
                print(f"  {(k + 1) * step:,} pending timers: RssAnon {rows[-1][1]:.1f} MiB, VmRSS (with mapped "
                      f"files) {rows[-1][2]:.1f} MiB", flush=True)
            timer_log = sum(f.stat().st_size for f in (tmp / "embedded" / "timerlog").iterdir())
            filed = b.timer_store.enqueued
        finally:
            b.shutdown()
    return {"pending": m, "filed": filed, "rss_mib (pending, RssAnon, VmRSS)": rows,
            "anon_growth_mib_after_first_quarter": round(rows[-1][1] - rows[1][1], 1),
            "timer_log_bytes_allocated": timer_log}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--timers", type=int, default=None)
    ap.add_argument("--window", type=float, default=None)
    ap.add_argument("--pending", type=int, default=None)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    args = ap.parse_args()
    n = args.timers or (10_000 if args.quick else 100_000)
    window = args.window or (10.0 if args.quick else 60.0)
    pending = args.pending or (100_000 if args.quick else 1_000_000)
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="timer-", dir=base))
    try:
        print(f"lateness: {n:,} timers over {window:.0f} s through the broker (precision 1000 ms)", flush=True)
        late = lateness(tmp, n, window)
        print(json.dumps(late, indent=1), flush=True)
        print(f"memory: {pending:,} pending timers in an embedded broker", flush=True)
        mem = pending_memory(tmp, pending)
        print(json.dumps(mem, indent=1), flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    out = Path(args.out) / f"timer-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps({"lateness": late, "memory": mem}, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

