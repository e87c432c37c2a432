#!/usr/bin/env python3
"""Instructions our client process executes per synchronous send, counted by valgrind's cachegrind
(deterministic, unlike this VM's clocks).

    python benchmarks/cachegrind_client.py [single|trivial|pop1|pop32|tx|txw] ... [--n 2000] [--base 400] [--callgrind DIR]

The broker (`serve_in_thread`, bench_broker.py's settings) runs in a child process NOT under valgrind;
the client (`Producer.send` of one 200-byte message, bench_broker.py's messages, round-robin queues;
`trivial`: a GET_MAX_OFFSET through `RemotingClient.invoke`; `pop1` / `pop32`: bench_pop.py's waited pair,
`PopConsumer.pop(max_nums=B, invisible_time=60_000, poll_time=1000)` then `ack_batch` of what it took, on a
topic this script fills beforehand from outside valgrind, B messages a pair, so no pop comes back empty; `tx`:
`TransactionProducer.prepare` of one such message and its one-way `end_transaction` COMMIT, per pair, as a
Django append sends them; `txw`: the same with a no-op `while_waiting`, the Django face's call) runs twice under
`valgrind --tool=cachegrind --cache-sim=no`, once for `--base` requests and once for `--n`. Per request =
(instructions of the long run - of the short run) / (n - base): import, start-up, route look-up, making
the messages (n in both runs) and shut-down cancel out. `--callgrind DIR` also keeps a callgrind profile of the long run in DIR (read it
with `callgrind_annotate --inclusive=yes`). A profiling tool: nothing is compared and nothing is timed.
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

from benchmarks.bench_broker import BROKER_CONFIG  # noqa: E402
from benchmarks.cachegrind_broker import BROKER_CHILD, instructions  # noqa: E402

CLIENT = r"""
import sys
sys.path.insert(0, sys.argv[4])
from benchmarks.bench_broker import BODIES, TAG
from rmq_eventstore.client import Message, Producer
from rmq_eventstore.remoting import RemotingCommand, RequestCode
namesrv, phase, n, made = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[5])
if phase in ("pop1", "pop32"):  # one pop + ack_batch a request, as bench_pop.py's waited rows
    from rmq_eventstore.client import PopConsumer
    size, topic = int(phase[3:]), sys.argv[6]
    with PopConsumer(namesrv, "cg-pop-" + topic, timeout_ms=60_000) as c:
        c.ack_batch(c.pop(topic, max_nums=size, invisible_time=60_000, poll_time=1000))  # warm: route, connection
        for _ in range(n):
            msgs = c.pop(topic, max_nums=size, invisible_time=60_000, poll_time=1000)
            c.ack_batch(msgs)
            assert len(msgs) == size, (len(msgs), size)
    raise SystemExit(0)
if phase in ("tx", "txw"):  # a half message and its one-way END_TRANSACTION COMMIT, as a Django append (per pair)
    from rmq_eventstore.client import TransactionProducer, TransactionState
    with TransactionProducer(namesrv, "cg-tx", lambda half: TransactionState.COMMIT, send_timeout_ms=60_000) as tp:
        tp.end_transaction(tp.prepare(Message("Profile", BODIES[0], tags=TAG, keys=["warm"])), TransactionState.COMMIT)
        msgs = [Message("Profile", BODIES[i & 1023], tags=TAG, keys=[f"k{i:010d}"]) for i in range(made)][:n]
        prepare, end, commit = tp.prepare, tp.end_transaction, TransactionState.COMMIT
        if phase == "tx":
            for m in msgs:
                end(prepare(m), commit)
        else:  # txw: with a while_waiting callable (a no-op here; the marker row's insert in the Django face)
            def noop():
                pass
            for m in msgs:
                end(prepare(m, while_waiting=noop), commit)
    raise SystemExit(0)
with Producer(namesrv, "cg-producer", send_timeout_ms=60_000) as p:
    p.send(Message("Profile", BODIES[0], tags=TAG, keys=["warm"]))
    # as many messages made in every run (`made`), so that their cost cancels out of the difference
    msgs = [Message("Profile", BODIES[i & 1023], tags=TAG, keys=[f"k{i:010d}"]) for i in range(made)][:n]
    if phase == "single":
        send = p.send
        for m in msgs:
            send(m)
    elif phase == "trivial":
        addr, _q = p._pick("Profile", 0, None)
        remoting = p._base.remoting
        for _ in range(n):
            remoting.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                          {"topic": "Profile", "queueId": 0}), timeout=60)
    else:
        raise SystemExit(f"unknown phase {phase!r}")
"""


_filled = iter(range(1 << 30))


def fill(namesrv: str, phase: str, n: int) -> str:
    """For a pop phase: a new topic holding (n + 1) * B messages in queue 0 (sent from this process, outside
    valgrind), so that each of the client's pops takes B; "" for the other phases."""
    if not phase.startswith("pop"):
        return ""
    from benchmarks.bench_broker import BODIES, TAG
    from rmq_eventstore.client import Message, Producer

    size, topic = int(phase[3:]), f"CgPop{phase[3:]}x{next(_filled)}"
    total = (n + 1) * size
    with Producer(namesrv, "cg-fill", send_timeout_ms=60_000) as p:
        for i in range(0, total, 100):
            p.send_batch([Message(topic, BODIES[j & 1023], tags=TAG) for j in range(i, min(i + 100, total))],
                         queue_id=0)
    return topic


def run_once(namesrv: str, phase: str, n: int, made: int, root: Path, callgrind: Path | None = None) -> int:
    """Total instructions of a client process that made `n` requests of `phase`."""
    topic = fill(namesrv, phase, n)
    out = Path(tempfile.mkdtemp(prefix="cg-client-", dir=root)) / "cachegrind.out"
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONMALLOC="malloc")
    tool = (["--tool=callgrind", f"--callgrind-out-file={callgrind / f'callgrind.{phase}.out'}"] if callgrind
            else ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"])
    subprocess.run(["valgrind", *tool, sys.executable, "-c", CLIENT, namesrv, phase, str(n), str(REPO), str(made), topic],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
    return 0 if callgrind else instructions(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("phases", nargs="*", default=["single"])
    ap.add_argument("--n", type=int, default=2000, help="requests (pop phases: pop + ack pairs)")
    ap.add_argument("--base", type=int, default=400)
    ap.add_argument("--callgrind", type=Path, default=None, help="also keep a callgrind profile here")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="cachegrind-client-"))
    broker = subprocess.Popen([sys.executable, "-c", BROKER_CHILD, str(root / "store"), json.dumps(BROKER_CONFIG)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              cwd=REPO, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    try:
        namesrv = json.loads(broker.stdout.readline())["namesrv"]
        for phase in args.phases:
            small = run_once(namesrv, phase, args.base, args.n, root)
            large = run_once(namesrv, phase, args.n, args.n, root)
            per = (large - small) / (args.n - args.base)
            print(f"{phase:8s} {per:12,.0f} instructions per request (client process; {args.base} vs {args.n})",
                  flush=True)
            if args.callgrind is not None:
                args.callgrind.mkdir(parents=True, exist_ok=True)
                run_once(namesrv, phase, args.n, args.n, root, args.callgrind)
    finally:
        broker.stdin.write("quit\n")
        broker.stdin.flush()
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(30)
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
