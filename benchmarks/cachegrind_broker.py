#!/usr/bin/env python3
"""Instructions the broker process executes per request, counted by valgrind's cachegrind (deterministic,
unlike this VM's clocks, which drift 2-4x within minutes).

    python benchmarks/cachegrind_broker.py [trivial|single|pop1|pop32|tx] ... [--n 2000] [--base 400]

For each phase the broker (`serve_in_thread`, bench_broker.py's settings) runs twice under
`valgrind --tool=cachegrind --cache-sim=no`, once serving `--base` requests of the phase and once `--n`;
the client is this process (our `Producer` / `PopConsumer`, not under valgrind). Per request =
(instructions of the long run - of the short run) / (n - base): start-up, warm-up and shut-down cancel
out; the broker's idle wake-ups (timed waits of its service threads) add a little noise. `trivial` is a
GET_MAX_OFFSET round trip, `single` a SEND_MESSAGE_V2 of one 200-byte message, `pop1` a POP of one
message followed by its ACK (counted as one request pair), `pop32` POPs of 32 messages each followed by one
BATCH_ACK (counted per message), `tx` a half message and its one-way END_TRANSACTION COMMIT (per pair),
`query` a QUERY_MESSAGE by key (what a QuerySet's `filter(keys=...)` asks). The pop phases and `query`
include the sends that fill the topic first (100 a batch), which `fill` alone counts (subtract it). A
profiling tool: nothing is compared with a peer and nothing is timed. Needs valgrind (Debian's `valgrind`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_broker import BODIES, BROKER_CONFIG, TAG  # noqa: E402

BROKER_CHILD = r"""
import json, sys
from rmq_eventstore.broker.server import serve_in_thread
running = serve_in_thread(sys.argv[1], announce=False, **json.loads(sys.argv[2]))
print(json.dumps({"namesrv": running.namesrv_address}), flush=True)
sys.stdin.readline()
running.close()
"""


def pop_and_ack(c, size: int, n: int) -> None:  # type: ignore[no-untyped-def]
    """Pop `n` messages of "Profile", `size` a POP: each acked alone (size 1) or one BATCH_ACK a POP."""
    got = 0
    while got < n:
        popped = c.pop("Profile", max_nums=size, invisible_time=60_000)
        if size == 1:
            for m in popped:
                c.ack(m)
        else:
            c.ack_batch(popped)
        got += len(popped) or 1


def instructions(out_file: Path) -> int:
    """The total of a cachegrind output file (its `summary:` line)."""
    for line in out_file.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {out_file}")


def run_once(phase: str, n: int, root: Path, keep: Path | None = None) -> int:
    """Total instructions of a broker process that served `n` requests of `phase`."""
    from rmq_eventstore.client import Message, PopConsumer, Producer
    from rmq_eventstore.remoting import RemotingCommand, RequestCode

    path = tempfile.mkdtemp(prefix="cg-broker-", dir=root)
    out = Path(path) / "cachegrind.out"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONMALLOC="malloc")
    tool = (["--tool=callgrind", f"--callgrind-out-file={out}"] if keep is not None
            else ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"])
    proc = subprocess.Popen(["valgrind", *tool,
                             sys.executable, "-c", BROKER_CHILD, str(Path(path) / "store"), json.dumps(BROKER_CONFIG)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            cwd=REPO, env=env)
    try:
        namesrv = json.loads(proc.stdout.readline())["namesrv"]
        with Producer(namesrv, "cg-producer", send_timeout_ms=60_000) as p:
            p.send(Message("Profile", BODIES[0], tags=TAG, keys=["warm"]), queue_id=0)
            msgs = [Message("Profile", BODIES[i & 1023], tags=TAG, keys=[f"k{i:010d}"]) for i in range(n)]
            if phase == "trivial":
                addr, _q = p._pick("Profile", 0, None)
                remoting = p._base.remoting
                for _ in range(n):
                    remoting.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                                  {"topic": "Profile", "queueId": 0}), timeout=60)
            elif phase == "single":
                for m in msgs:
                    p.send(m, queue_id=0)
            elif phase == "fill":  # only what the pop phases send first (theirs minus this: the POP + ACK)
                for i in range(0, n, 100):
                    p.send_batch(msgs[i:i + 100], queue_id=0)
            elif phase in ("pop1", "pop32"):  # pop1: each message acked alone; pop32: one BATCH_ACK a pop
                for i in range(0, n, 100):
                    p.send_batch(msgs[i:i + 100], queue_id=0)
                size = int(phase[3:])
                with PopConsumer(namesrv, "cg-pop", timeout_ms=60_000) as c:
                    pop_and_ack(c, size, n)
            elif phase == "tx":  # a half message and its END_TRANSACTION COMMIT (one-way), as a Django append
                from rmq_eventstore.client import TransactionProducer, TransactionState

                with TransactionProducer(namesrv, "cg-tx", lambda half: TransactionState.COMMIT,
                                         send_timeout_ms=60_000) as tp:
                    for m in msgs:
                        tp.end_transaction(tp.prepare(m), TransactionState.COMMIT)
                    addr, _q = tp._pick("Profile", 0, None)  # a request answered after every END was served
                    tp._base.remoting.invoke(addr, RemotingCommand.request(
                        RequestCode.GET_MAX_OFFSET, {"topic": "Profile", "queueId": 0}), timeout=60)
            elif phase == "query":  # a QUERY_MESSAGE by key per request (a QuerySet's filter(keys=...)), after the fill
                from rmq_eventstore.client import Admin

                for i in range(0, n, 100):
                    p.send_batch(msgs[i:i + 100], queue_id=0)
                with Admin(namesrv, 60_000) as admin:
                    for i in range(n):
                        assert len(admin.query_message("Profile", f"k{i:010d}", 32)) == 1
            else:
                raise SystemExit(f"unknown phase {phase!r}")
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        proc.wait(600)
        if keep is not None:
            shutil.copy(out, keep)
            return 0
        return instructions(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        shutil.rmtree(path, ignore_errors=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phases", nargs="*", default=["trivial", "single"])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--base", type=int, default=400)
    ap.add_argument("--callgrind", metavar="FILE", help="instead: one run of the first phase (--n requests) under "
                    "callgrind, its output file kept (for callgrind_annotate --inclusive=yes)")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="cachegrind-broker-"))
    if args.callgrind:
        try:
            run_once(args.phases[0], args.n, root, Path(args.callgrind).resolve())
        finally:
            shutil.rmtree(root, ignore_errors=True)
        return 0
    try:
        for phase in args.phases:
            small = run_once(phase, args.base, root)
            large = run_once(phase, args.n, root)
            per = (large - small) / (args.n - args.base)
            print(f"{phase:8s} {per:12,.0f} instructions per request (broker process; {args.base} vs {args.n})",
                  flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
