"""cProfile and thread CPU of Celery's `delay` on our kombu transport (a broker child process), or on Redis.

    python benchmarks/profile_celery_apply.py [--tasks N] [--redis] [--cprofile] [--rounds R]

Prints the producer thread's CPU µs per `delay` (time.thread_time, no profiler attached) per round, and
with --cprofile the top functions by cumulative time per call. With --loop N it only runs N delays after the
warm-up (for `valgrind --tool=cachegrind` runs of N and M delays: the difference over N-M is per delay).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

import kombu.pools  # noqa: E402
from benchlib import broker_process  # noqa: E402

from benchmarks.celery_bench_app import TASK, make_app  # noqa: E402

_TICK = os.sysconf("SC_CLK_TCK")


def proc_cpu(pid: int | None) -> float:
    """User + system CPU seconds of process `pid` (0 without one)."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def run(url: str, args: argparse.Namespace, broker_pid: int | None = None) -> None:
    queue = f"bench.celery.{os.getpid()}.prof"
    app = make_app(url, queue)
    task = app.tasks[TASK]
    with app.connection_for_write() as conn:
        app.amqp.queues[queue].bind(conn.default_channel).declare()
    for i in range(50):
        task.delay(10**6 + i)
    if args.loop is not None:
        for i in range(args.loop):
            task.delay(i)
        return
    if args.ab:
        ab(task, args)
        return
    n = args.tasks
    for r in range(args.rounds):
        u0 = resource.getrusage(resource.RUSAGE_THREAD)
        b0, c0, t0 = proc_cpu(broker_pid), time.thread_time(), time.perf_counter()
        for i in range(n):
            task.delay(i)
        c1, t1, b1 = time.thread_time(), time.perf_counter(), proc_cpu(broker_pid)
        u1 = resource.getrusage(resource.RUSAGE_THREAD)
        print(f"round {r + 1}: {n / (t1 - t0):8,.0f} delays/s  thread CPU {(c1 - c0) / n * 1e6:6.1f} µs/delay  "
              f"(user {(u1.ru_utime - u0.ru_utime) / n * 1e6:5.1f} sys {(u1.ru_stime - u0.ru_stime) / n * 1e6:5.1f})  "
              f"wall {(t1 - t0) / n * 1e6:6.1f} µs  broker CPU {(b1 - b0) / n * 1e6:6.1f} µs", flush=True)
    if args.cprofile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
        for i in range(n):
            task.delay(i)
        prof.disable()
        if os.environ.get("PROFILE_OUT"):
            prof.dump_stats(os.environ["PROFILE_OUT"])
        st = pstats.Stats(prof)
        st.sort_stats("cumulative").print_stats(60)
        st.sort_stats("tottime").print_stats(40)
    kombu.pools.reset()
    with app.connection_for_write() as conn:
        conn.default_channel.queue_delete(queue)


def ab(task: object, args: argparse.Namespace) -> None:
    """Blocks of `--tasks` delays, alternately through the publish path as it was (the reference `_put` of
    tests/test_kombu_publish_fastpath.py, the producer's general path) and as it is, in one process on one
    broker: thread CPU and wall per delay, medians over `--rounds` pairs (the machine's drift hits both)."""
    import statistics

    from rmq_eventstore.client import producer as producer_mod
    from rmq_eventstore.kombu.transport import Channel

    sys.path.insert(0, str(ROOT / "tests"))
    from tests.test_kombu_publish_fastpath import reference_put

    fast_put, fast_frame = Channel._put, producer_mod._send_frame
    out: dict[str, list[tuple[float, float]]] = {"reference": [], "fast": []}
    n = args.tasks
    for _ in range(args.rounds):
        for name in ("reference", "fast"):
            Channel._put = reference_put if name == "reference" else fast_put  # type: ignore[method-assign]
            producer_mod._send_frame = None if name == "reference" else fast_frame
            c0, t0 = time.thread_time(), time.perf_counter()
            for i in range(n):
                task.delay(i)  # type: ignore[attr-defined]
            out[name].append(((time.thread_time() - c0) / n * 1e6, (time.perf_counter() - t0) / n * 1e6))
    Channel._put, producer_mod._send_frame = fast_put, fast_frame  # type: ignore[method-assign]
    for name, xs in out.items():
        print(f"{name:9s} thread CPU µs/delay median {statistics.median(x for x, _ in xs):6.1f} "
              f"wall µs/delay median {statistics.median(w for _, w in xs):6.1f} (rounds {len(xs)})")
    ratios = [r[0] / f[0] for r, f in zip(out["reference"], out["fast"], strict=True)]
    print(f"reference/fast thread CPU per pair: median {statistics.median(ratios):.3f} "
          f"(min {min(ratios):.3f}, max {max(ratios):.3f})")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--redis", action="store_true")
    ap.add_argument("--memory", action="store_true")
    ap.add_argument("--cprofile", action="store_true")
    ap.add_argument("--loop", type=int, default=None)
    ap.add_argument("--ab", action="store_true", help="alternate the reference publish path and this one")
    args = ap.parse_args()
    if args.redis:
        run("redis://127.0.0.1:6379/15", args)
        return
    if args.memory:
        run("memory://", args)
        return
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="celery-prof-", dir=base))
    try:
        with broker_process(tmp / "store") as (broker, ns):
            run(f"rocketmq://{ns}//", args, broker.pid)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
