#!/usr/bin/env python3
"""Where the broker process spends its time, per operation: CPU per thread, and cProfile of the event-loop
thread and of the store's dispatch (reput) thread, for one phase at a time.

    python benchmarks/profile_broker.py [trivial|single|batch|pull32|pull256|pop|pop1|tx] ... [--n N] [--no-cprofile]
                                        [--event-loop auto|uvloop|asyncio]

The broker runs in a child process (`serve_in_thread`, the settings of bench_broker.py) driven over stdin:
the client (this process, our `Producer` / `PullConsumer` / `PopConsumer`) fills what a phase needs, then
the child starts counting, the phase runs, and the child prints, per thread, the CPU seconds the phase
cost (`pthread_getcpuclockid`), then the top functions of the loop thread and of the dispatch thread.
cProfile slows Python code about twofold: compare shares, and take per-operation CPU from a run with
`--no-cprofile`. The client's CPU per request is measured as well (`client_cpu_us_per_request`: the
calling thread's `time.thread_time`, and the whole client process's `time.process_time`). `trivial` is a
GET_MAX_OFFSET round trip (the request path with no store work), `tx` a half message and its one-way
END_TRANSACTION COMMIT (what a Django append in a transaction sends). `--client-profile` runs the client
under cProfile instead (its top functions; the broker side then runs without its profiler). A profiling
tool, not a benchmark: nothing here is compared with a peer. The broker's profiles list the top 18 functions by
own time; `PROFILE_TOP=N` and `PROFILE_SORT=ncalls` (any pstats key) change that (`ncalls` lists every call
an operation makes).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.bench_broker import BODIES, BROKER_CONFIG, TAG  # noqa: E402

CHILD = r"""
import cProfile, io, json, pstats, sys, threading, time
from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.store.reput import ReputMessageService

config = json.loads(sys.argv[2])
profile = sys.argv[3] == "1"
running = serve_in_thread(sys.argv[1], announce=False, **config)
print(json.dumps({"namesrv": running.namesrv_address, "loop": getattr(running, "event_loop", "asyncio")}),
      flush=True)
loop_prof, reput_prof, on = cProfile.Profile(), cProfile.Profile(), [False]
real_reput = ReputMessageService.do_reput

def do_reput(self):  # profiled on the dispatch thread while a phase runs
    if not on[0]:
        return real_reput(self)
    reput_prof.enable()
    try:
        return real_reput(self)
    finally:
        reput_prof.disable()

ReputMessageService.do_reput = do_reput

def cpu():
    out = {}
    for t in threading.enumerate():
        try:
            out[t.name] = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError, TypeError):
            pass
    return out

def top(prof, n=int(__import__("os").environ.get("PROFILE_TOP", "18"))):
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats(__import__("os").environ.get("PROFILE_SORT", "tottime")).print_stats(n)
    lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
    start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
    return lines[start:]

for line in sys.stdin:
    cmd = line.strip()
    if cmd == "start":
        loop_prof, reput_prof = cProfile.Profile(), cProfile.Profile()
        c0, w0 = cpu(), time.monotonic()
        if profile:
            on[0] = True
            ev = threading.Event()
            running.loop.call_soon_threadsafe(lambda: (loop_prof.enable(), ev.set()))
            ev.wait(5)
        print("ok", flush=True)
    elif cmd == "stop":
        if profile:
            on[0] = False
            ev = threading.Event()
            running.loop.call_soon_threadsafe(lambda: (loop_prof.disable(), ev.set()))
            ev.wait(5)
        c1, wall = cpu(), time.monotonic() - w0
        threads = {k: round(v - c0.get(k, 0.0), 4) for k, v in c1.items() if v - c0.get(k, 0.0) > 0.002}
        out = {"wall": round(wall, 4), "threads": threads}
        if profile:
            out["loop_thread"] = top(loop_prof)
            out["dispatch_thread"] = top(reput_prof)
        print(json.dumps(out), flush=True)
running.close()
"""


class Child:
    def __init__(self, root: Path, profile: bool, event_loop: str | None) -> None:
        self.path = tempfile.mkdtemp(prefix="profile-broker-", dir=root)
        config = dict(BROKER_CONFIG)
        if event_loop:
            config["event_loop"] = event_loop
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD, self.path, json.dumps(config), "1" if profile else "0"],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO)
        info = json.loads(self.proc.stdout.readline())
        self.namesrv, self.loop = info["namesrv"], info["loop"]

    def ask(self, cmd: str) -> str:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline()

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        shutil.rmtree(self.path, ignore_errors=True)


def _rusage() -> tuple[float, float]:
    """The calling thread's user and system CPU seconds (getrusage(RUSAGE_THREAD))."""
    import resource
    r = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return r.ru_utime, r.ru_stime


def run_phase(phase: str, n: int, profile: bool, event_loop: str | None, root: Path,
              client_profile: bool = False) -> dict:
    import cProfile

    from rmq_eventstore.client import Message, PopConsumer, Producer, PullConsumer

    client_prof = cProfile.Profile() if client_profile else None
    child = Child(root, profile and not client_profile, event_loop)
    try:
        with Producer(child.namesrv, "profile-producer") as p:
            p.send(Message("Profile", BODIES[0], tags=TAG, keys=["warm"]), queue_id=0)
            msgs = [Message("Profile", BODIES[i & 1023], tags=TAG, keys=[f"k{i:010d}"]) for i in range(n)]
            if phase.startswith(("pull", "pop")):
                for i in range(0, n, 100):
                    p.send_batch(msgs[i:i + 100], queue_id=0)
                time.sleep(0.5)  # dispatched
            ops = n
            thread0, proc0, ru0 = time.thread_time(), time.process_time(), _rusage()
            if phase == "trivial":
                from rmq_eventstore.remoting import RemotingCommand, RequestCode
                addr, _q = p._pick("Profile", 0, None)
                remoting = p._base.remoting
                for _ in range(200):  # warm
                    remoting.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                                  {"topic": "Profile", "queueId": 0}))
                child.ask("start")
                thread0, proc0, ru0 = time.thread_time(), time.process_time(), _rusage()
                if client_prof is not None:
                    client_prof.enable()
                t = time.perf_counter()
                for _ in range(n):
                    remoting.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET,
                                                                  {"topic": "Profile", "queueId": 0}))
            elif phase == "single":
                child.ask("start")
                thread0, proc0, ru0 = time.thread_time(), time.process_time(), _rusage()
                if client_prof is not None:
                    client_prof.enable()
                t = time.perf_counter()
                for m in msgs:
                    p.send(m, queue_id=0)
            elif phase == "batch":
                child.ask("start")
                t = time.perf_counter()
                for i in range(0, n, 100):
                    p.send_batch(msgs[i:i + 100], queue_id=0)
                ops = (n + 99) // 100
            elif phase.startswith("pull"):
                size = int(phase[4:])
                with PullConsumer(child.namesrv, "profile-reader") as c:
                    c.pull("Profile", 0, 0, max_nums=1, suspend_timeout_ms=0)
                    child.ask("start")
                    t = time.perf_counter()
                    offset, ops = 0, 0
                    while True:
                        r = c.pull("Profile", 0, offset, max_nums=size, suspend_timeout_ms=0)
                        if not r.messages:
                            break
                        offset, ops = r.next_begin_offset, ops + 1
            elif phase.startswith("pop"):
                size = int(phase[3:] or 32)
                with PopConsumer(child.namesrv, "profile-pop") as c:
                    child.ask("start")
                    t = time.perf_counter()
                    got, ops = 0, 0
                    while got < n:
                        popped = c.pop("Profile", max_nums=size, invisible_time=60_000, poll_time=1000)
                        c.ack_batch(popped)
                        got, ops = got + len(popped), ops + 1
            elif phase == "tx":  # a half message and its one-way END_TRANSACTION COMMIT, as a Django append
                from rmq_eventstore.client import TransactionProducer, TransactionState
                from rmq_eventstore.remoting import RemotingCommand, RequestCode

                with TransactionProducer(child.namesrv, "profile-tx", lambda half: TransactionState.COMMIT) as tp:
                    for m in msgs[:200]:  # warm
                        tp.end_transaction(tp.prepare(m), TransactionState.COMMIT)
                    child.ask("start")
                    thread0, proc0, ru0 = time.thread_time(), time.process_time(), _rusage()
                    t = time.perf_counter()
                    for m in msgs:
                        tp.end_transaction(tp.prepare(m), TransactionState.COMMIT)
                    addr, _q = tp._pick("Profile", 0, None)  # answered after every END was served
                    tp._base.remoting.invoke(addr, RemotingCommand.request(
                        RequestCode.GET_MAX_OFFSET, {"topic": "Profile", "queueId": 0}))
            else:
                raise SystemExit(f"unknown phase {phase!r}")
            wall = time.perf_counter() - t
            if client_prof is not None:
                client_prof.disable()
            client_thread, client_proc = time.thread_time() - thread0, time.process_time() - proc0
            ru1 = _rusage()
        res = json.loads(child.ask("stop"))
    finally:
        child.close()
    res.update(phase=phase, loop=child.loop, messages=n, requests=ops, client_wall=round(wall, 4),
               msgs_per_s=round(n / wall), cprofile=profile)
    res["cpu_us_per_request"] = {k: round(v / ops * 1e6, 1) for k, v in res["threads"].items()}
    res["client_cpu_us_per_request"] = {"calling thread": round(client_thread / ops * 1e6, 1),
                                        "process": round(client_proc / ops * 1e6, 1),
                                        "calling thread user": round((ru1[0] - ru0[0]) / ops * 1e6, 1),
                                        "calling thread sys": round((ru1[1] - ru0[1]) / ops * 1e6, 1)}
    if client_prof is not None:
        import io
        import pstats
        s = io.StringIO()
        pstats.Stats(client_prof, stream=s).sort_stats("tottime").print_stats(22)
        lines = [ln for ln in s.getvalue().splitlines() if ln.strip()]
        start = next((i for i, ln in enumerate(lines) if ln.lstrip().startswith("ncalls")), 0)
        res["client"] = lines[start:]
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("phases", nargs="*", default=["single", "batch", "pull32", "pop"])
    ap.add_argument("--n", type=int, default=2000, help="messages per phase (default 2000)")
    ap.add_argument("--no-cprofile", action="store_true", help="per-thread CPU only (no profiler overhead)")
    ap.add_argument("--client-profile", action="store_true", help="cProfile the client instead of the broker")
    ap.add_argument("--event-loop", choices=("auto", "uvloop", "asyncio"), default=None)
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    root = Path(tempfile.gettempdir())
    results = []
    for phase in args.phases:
        res = run_phase(phase, args.n, not args.no_cprofile, args.event_loop, root, args.client_profile)
        results.append(res)
        print(f"== {phase} ({res['loop']}): {res['requests']} requests, {res['msgs_per_s']:,} msgs/s "
              f"(client wall {res['client_wall']} s{', under cProfile' if res['cprofile'] else ''})")
        for name, us in sorted(res["cpu_us_per_request"].items(), key=lambda kv: -kv[1]):
            print(f"   {us:9.1f} us CPU per request  {name}")
        for name, us in res["client_cpu_us_per_request"].items():
            print(f"   {us:9.1f} us CPU per request  client {name}")
        for key in ("loop_thread", "dispatch_thread", "client"):
            if res.get(key):
                print(f"   -- {key} (cProfile, by own time)")
                print("\n".join("   " + ln for ln in res[key]))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
