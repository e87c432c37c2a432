#!/usr/bin/env python3
"""Broker instructions per POP (+ its ACK) alone, on the event loop's thread: the fill left out.

    python benchmarks/callgrind_pop_window.py pop1|pop32 [--n 1000]

`cachegrind_broker.py pop32` counts the fill's sends too (about 80% of that phase), and `pop32 - fill` of two
whole-process counts is noise-bound (their difference moves by ~1k a message between runs). Here the broker
(`serve_in_thread`, bench_broker.py's settings) runs under `valgrind --tool=callgrind --separate-threads=yes`;
the client (this process) fills the topic, pops 32 batches to warm up, zeroes the counters
(`callgrind_control -z`), pops and acks `--n` messages as cachegrind_broker.py's pop phases do, and dumps
(`callgrind_control -d`). Reported: the busiest thread's count (the event loop's, which serves the lanes) per
message; the other threads' idle wake-ups are left out. A profiling tool, nothing is timed. Needs valgrind."""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_broker import BODIES, BROKER_CONFIG, TAG  # noqa: E402
from benchmarks.cachegrind_broker import BROKER_CHILD, pop_and_ack  # noqa: E402


def run(phase: str, n: int, keep: str | None = None) -> int:
    """The event loop thread's instructions over `n` messages of `phase` (pop1: POP of 1 + ACK; pop32: POP of 32
    + one BATCH_ACK)."""
    from rmq_eventstore.client import Message, PopConsumer, Producer

    path = Path(tempfile.mkdtemp(prefix="cg-pop-window-"))
    out = path / "callgrind.out"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONMALLOC="malloc")
    proc = subprocess.Popen(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                             sys.executable, "-c", BROKER_CHILD, str(path / "store"), json.dumps(BROKER_CONFIG)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO, env=env)
    size = int(phase[3:])
    try:
        namesrv = json.loads(proc.stdout.readline())["namesrv"]
        with Producer(namesrv, "cg-producer", send_timeout_ms=60_000) as p:
            p.send(Message("Profile", BODIES[0], tags=TAG, keys=["warm"]), queue_id=0)
            msgs = [Message("Profile", BODIES[i & 1023], tags=TAG, keys=[f"k{i:010d}"]) for i in range(n + 64 * size)]
            for i in range(0, len(msgs), 100):
                p.send_batch(msgs[i:i + 100], queue_id=0)
            with PopConsumer(namesrv, "cg-pop", timeout_ms=60_000) as c:
                pop_and_ack(c, size, 32 * size)
                time.sleep(2)  # the fill's dispatch done before the counters start
                subprocess.run(["callgrind_control", "-z", str(proc.pid)], check=True, capture_output=True)
                pop_and_ack(c, size, n)
                subprocess.run(["callgrind_control", "-d", str(proc.pid)], check=True, capture_output=True)
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(600)
        totals = {}
        for f in glob.glob(f"{out}*"):
            text = Path(f).read_text()
            if "Trigger: Program termination" in text:
                continue
            for line in text.splitlines():
                if line.startswith(("summary:", "totals:")):
                    totals[f] = int(line.split()[1])
        busiest = max(totals, key=totals.get)
        if keep:
            shutil.copy(busiest, keep)
        return totals[busiest]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phase", choices=["pop1", "pop32"])
    ap.add_argument("--n", type=int, default=None, help="messages counted (default 1000 for pop1, 3200 for pop32)")
    ap.add_argument("--keep", metavar="FILE", help="keep the loop thread's callgrind file (callgrind_annotate)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    n = args.n or (1000 if args.phase == "pop1" else 3200)
    total = run(args.phase, n, args.keep)
    print(f"{args.phase:6s} {total / n:12,.0f} instructions per message (broker event loop thread; {n} messages)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
