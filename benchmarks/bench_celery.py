"""Celery on our kombu transport against Celery on the local Redis and RabbitMQ, in ONE run.

    python benchmarks/bench_celery.py [--quick] [--tasks N] [--rounds R] [--only apply|drain|events]

1. apply_async: one producer (this process) calls ``it.delay(i)`` N times; tasks/s. Celery's defaults
   (persistent messages, its producer pool); the same calls fill the queue for step 2.
2. Drain: one worker (``celery worker -P solo``, and ``-P prefork -c 2``) started on the filled queue;
   tasks/s between the first and the last task run, for acks as Celery's default (ack before running)
   and with ``task_acks_late``. The task is trivial: it appends 16 bytes to a per-process file (the sink),
   so the benchmark also checks that every task ran exactly once.
3. Event-handler path: N events sent to a topic of 4 queues (one ``Producer.send`` each), handled by an
   ``@event_handler`` in one worker (the bootstep's cluster consumer, in the worker's main process): send
   rate and handle rate, next to a plain Celery task per event (steps 1 and 2, solo pool) on our transport
   and on Redis.

Peers: Redis 127.0.0.1:6379 (db 15; kombu's redis transport) and RabbitMQ 127.0.0.1:5672 (guest,
``pyamqp://``). Ours: a broker (``rmq-eventstore serve``) in a child process on a fresh store under
``var/bench/``, ``rocketmq://127.0.0.1:<port>//``. Variants run interleaved (ours, Redis, RabbitMQ in a
rotating order) so a drift of the machine hits all alike. Queues are named ``bench.celery.<pid>.*`` and
deleted afterwards; a peer that is not running is skipped and said so.

Writes ``benchmarks/results/celery-<date>[-quick].json`` and ``benchmarks/results/celery.png``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import kombu.pools

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from benchlib import broker_process  # noqa: E402

from benchmarks.celery_bench_app import TASK, make_app, read_sink, sink_count  # noqa: E402

REDIS_URL = "redis://127.0.0.1:6379/15"
RABBIT_URL = "pyamqp://guest:guest@127.0.0.1:5672//"
POOLS = {"solo": ["-P", "solo"], "prefork": ["-P", "prefork", "-c", "2"]}


def start_worker(broker: str, queue: str, sink: Path, pool: str, acks_late: bool,
                 extra_env: dict[str, str] | None = None) -> subprocess.Popen:
    """One `celery worker` process of celery_bench_app consuming `queue`."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_BROKER=broker, BENCH_QUEUE=queue, BENCH_SINK=str(sink),
               BENCH_ACKS_LATE="1" if acks_late else "0", **(extra_env or {}))
    cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_bench_app", "worker", *POOLS[pool], "-Q", queue,
           "-n", f"bench{os.getpid()}-{time.monotonic_ns()}@%h", "--without-gossip", "--without-mingle",
           "--without-heartbeat", "-l", "WARNING"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop_worker(w: subprocess.Popen) -> str:
    """SIGTERM (warm shutdown), then SIGKILL of its process group after 20 s; returns its stderr's tail."""
    if w.poll() is None:
        w.send_signal(signal.SIGTERM)
    try:
        _, err = w.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(w.pid, signal.SIGKILL)
        _, err = w.communicate()
    return (err or "")[-2000:]


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of `pids` so far (from /proc; a process that is gone counts 0)."""
    total = 0.0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += (int(fields[11]) + int(fields[12])) / _TICK
    return total


def pids_named(comm: str) -> list[int]:
    """Processes whose command name is `comm` (the peers' servers: redis-server, beam.smp)."""
    out = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/comm") as f:
                    if f.read().strip() == comm:
                        out.append(int(d))
            except OSError:
                pass
    return out


def tree(pid: int) -> list[int]:
    """`pid` and its children (a prefork worker's pool processes)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [pid, *(int(x) for x in f.read().split())]
    except OSError:
        return [pid]


def wait_sink(sink: Path, n: int, worker: subprocess.Popen, timeout: float,
              at_first: list[float] | None = None) -> None:
    """Until `sink` holds n records; `at_first` gets the worker's CPU seconds when the first task has run."""
    deadline = time.monotonic() + timeout
    last, last_change = -1, time.monotonic()
    while True:
        got = sink_count(str(sink))
        if got >= n:
            return
        if got and at_first is not None and not at_first:
            at_first.append(cpu_s(tree(worker.pid)))
        if got != last:
            last, last_change = got, time.monotonic()
        if worker.poll() is not None:
            raise RuntimeError(f"the worker exited ({worker.returncode}) after {got}/{n}: {stop_worker(worker)}")
        if time.monotonic() > deadline or time.monotonic() - last_change > 60:
            raise RuntimeError(f"only {got}/{n} tasks ran: {stop_worker(worker)}")
        time.sleep(0.02)


def sink_stats(sink: Path, n: int, t_start: float) -> dict[str, Any]:
    recs = read_sink(str(sink))
    seqs = [s for s, _ in recs]
    times = sorted(t for _, t in recs)
    distinct = set(seqs)
    first, last = times[0], times[-1]
    return {"ran": len(recs), "distinct": len(distinct), "missing": n - len(distinct & set(range(n))),
            "duplicates": len(recs) - len(distinct), "boot_to_first_s": first - t_start,
            "drain_s": last - first, "drain_per_s": (len(recs) - 1) / (last - first) if last > first else 0.0}


class Side:
    """One broker under test: a name, a Celery broker URL and its server processes (for their CPU time)."""

    def __init__(self, name: str, url: str, server_pids: list[int] | None = None) -> None:
        self.name = name
        self.url = url
        self.server_pids = server_pids or []

    def delete_queue(self, queue: str) -> None:
        app = make_app(self.url, queue)
        with app.connection_for_write() as conn:
            ch = conn.default_channel
            ch.queue_delete(queue)
            if self.name == "redis":  # kombu's binding keys of the queue's exchange
                client = ch.client
                for k in client.keys(f"_kombu.binding*.{queue}"):
                    client.delete(k)
            elif self.name == "rabbitmq":
                ch.exchange_delete(queue)


def apply_and_drain(side: Side, queue: str, n: int, pool: str, acks_late: bool, tmp: Path) -> dict[str, Any]:
    """Fill `queue` with n tasks through `delay` (timed), then drain it with one worker (timed)."""
    app = make_app(side.url, queue, acks_late)
    task = app.tasks[TASK]
    with app.connection_for_write() as conn:  # declare the queue before timing (as a running worker would)
        app.amqp.queues[queue].bind(conn.default_channel).declare()
    warm = min(50, n // 10)
    for i in range(warm):  # the producer pool's connection, the exchange declaration cache
        task.delay(n + i)
    c0, s0 = time.process_time(), cpu_s(side.server_pids)
    t0 = time.perf_counter()
    for i in range(n):
        task.delay(i)
    apply_s = time.perf_counter() - t0
    apply_cpu = {"client_us": (time.process_time() - c0) / n * 1e6,
                 "server_us": (cpu_s(side.server_pids) - s0) / n * 1e6}
    kombu.pools.reset()  # this app's producer pool and connections: closed, and forgotten
    sink = tmp / f"sink-{side.name}-{pool}-{int(acks_late)}-{time.monotonic_ns()}"
    sink.mkdir()
    t_start = time.time()
    w = start_worker(side.url, queue, sink, pool, acks_late)
    at_first: list[float] = []
    try:
        s1 = cpu_s(side.server_pids)
        wait_sink(sink, n + warm, w, timeout=max(120.0, n / 20), at_first=at_first)
        worker_cpu = cpu_s(tree(w.pid)) - (at_first[0] if at_first else 0.0)
        server_cpu = cpu_s(side.server_pids) - s1
    finally:
        err = stop_worker(w)
    st = sink_stats(sink, n, t_start)
    st["duplicates"] = st["ran"] - st["distinct"]
    st.update(side=side.name, pool=pool, acks_late=acks_late, tasks=n, apply_s=apply_s, apply_per_s=n / apply_s,
              apply_cpu=apply_cpu, drain_cpu={"worker_us": worker_cpu / st["ran"] * 1e6,
                                              "server_us": server_cpu / st["ran"] * 1e6})
    if st["missing"] or st["duplicates"]:
        st["worker_stderr"] = err
    shutil.rmtree(sink, ignore_errors=True)
    return st


def apply_bound(n: int) -> float:
    """apply_async per second on kombu's in-process `memory://` transport: no broker, no socket, so what
    Celery and kombu themselves cost a producer; no transport can give Celery more on this machine."""
    app = make_app("memory://", f"bench.celery.{os.getpid()}.bound")
    task = app.tasks[TASK]
    with app.producer_or_acquire() as producer:
        for i in range(min(50, n // 10)):
            task.apply_async((i,), producer=producer)
        t0 = time.perf_counter()
        for i in range(n):
            task.apply_async((i,), producer=producer)
        rate = n / (time.perf_counter() - t0)
    kombu.pools.reset()
    return rate


def event_path(ns: str, broker_pid: int, n: int, tmp: Path) -> dict[str, Any]:
    """n events sent one by one to a 4-queue topic, then handled by an @event_handler in one solo worker."""
    from rmq_eventstore.client import Admin, Message, Producer

    topic = f"bench-events-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    with Admin(ns) as admin:
        admin.create_topic(topic, 4)
    with Producer(ns, "bench-events") as p:
        p.refresh_route(topic)
        p.send(Message(topic, b"-1"))
        t0 = time.perf_counter()
        for i in range(n):
            p.send(Message(topic, str(i).encode()))
        send_s = time.perf_counter() - t0
    sink = tmp / f"sink-events-{time.monotonic_ns()}"
    sink.mkdir()
    idle = f"bench.celery.{os.getpid()}.idle"
    t_start = time.time()
    w = start_worker(f"rocketmq://{ns}//", idle, sink, "solo", False,
                     {"BENCH_HANDLER_TOPIC": topic, "BENCH_STORE_URL": f"rmq://{ns}"})
    at_first: list[float] = []
    try:
        s1 = cpu_s([broker_pid])
        wait_sink(sink, n + 1, w, timeout=max(120.0, n / 20), at_first=at_first)
        worker_cpu = cpu_s(tree(w.pid)) - (at_first[0] if at_first else 0.0)
        server_cpu = cpu_s([broker_pid]) - s1
    finally:
        stop_worker(w)
    st = sink_stats(sink, n, t_start)
    st.update(side="ours", path="event handler", tasks=n, send_s=send_s, send_per_s=n / send_s,
              drain_cpu={"worker_us": worker_cpu / st["ran"] * 1e6, "server_us": server_cpu / st["ran"] * 1e6})
    shutil.rmtree(sink, ignore_errors=True)
    return st


def reachable(side: Side) -> str | None:
    try:
        app = make_app(side.url, "bench.probe")
        with app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
        return None
    except Exception as e:  # a peer that is not running is skipped and reported
        return f"{type(e).__name__}: {e}"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(runs: list[dict[str, Any]], events: list[dict[str, Any]], sides: list[str]) -> dict[str, Any]:
    s: dict[str, Any] = {"apply_per_s": {}, "drain_per_s": {}, "ratios": {}}
    for side in sides:
        s["apply_per_s"][side] = med([r["apply_per_s"] for r in runs if r["side"] == side])
        for pool in POOLS:
            for late in (False, True):
                xs = [r["drain_per_s"] for r in runs if r["side"] == side and r["pool"] == pool
                      and r["acks_late"] == late]
                if xs:
                    s["drain_per_s"].setdefault(f"{pool}{' acks_late' if late else ''}", {})[side] = med(xs)
    for peer in sides[1:]:
        # within each round: ours / peer of the same variant, median over rounds
        ratios: dict[str, float] = {}
        for key in ("apply",):
            by_round = [(a["apply_per_s"] / b["apply_per_s"]) for a, b in _pairs(runs, "ours", peer)]
            ratios[key] = med(by_round)
        for pool in POOLS:
            for late in (False, True):
                name = f"{pool}{' acks_late' if late else ''}"
                xs = [a["drain_per_s"] / b["drain_per_s"] for a, b in _pairs(runs, "ours", peer)
                      if a["pool"] == pool and a["acks_late"] == late and b["drain_per_s"]]
                if xs:
                    ratios[f"drain {name}"] = med(xs)
        s["ratios"][f"ours/{peer}"] = ratios
    s["cpu_us"] = {}
    for side in sides:
        mine = [r for r in runs if r["side"] == side]
        c: dict[str, float] = {"apply client": med([r["apply_cpu"]["client_us"] for r in mine]),
                               "apply server": med([r["apply_cpu"]["server_us"] for r in mine])}
        for pool in POOLS:
            for late in (False, True):
                xs = [r for r in mine if r["pool"] == pool and r["acks_late"] == late]
                if xs:
                    name = f"{pool}{' acks_late' if late else ''}"
                    c[f"drain {name} worker"] = med([r["drain_cpu"]["worker_us"] for r in xs])
                    c[f"drain {name} server"] = med([r["drain_cpu"]["server_us"] for r in xs])
        s["cpu_us"][side] = c
    if events:
        s["events"] = {"send_per_s": med([e["send_per_s"] for e in events]),
                       "handle_per_s": med([e["drain_per_s"] for e in events]),
                       "handle_worker_cpu_us": med([e["drain_cpu"]["worker_us"] for e in events]),
                       "handle_broker_cpu_us": med([e["drain_cpu"]["server_us"] for e in events])}
    return s


def _pairs(runs: list[dict[str, Any]], a: str, b: str) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    out = []
    for x in runs:
        if x["side"] != a:
            continue
        for y in runs:
            if y["side"] == b and y["round"] == x["round"] and y["pool"] == x["pool"] and y["acks_late"] == x["acks_late"]:
                out.append((x, y))
    return out


def markdown(s: dict[str, Any], sides: list[str], n: int, rounds: int) -> str:
    lines = [f"| tasks/s (N={n:,}, median of {rounds} round{'s' if rounds > 1 else ''}) | "
             + " | ".join(sides) + " | " + " | ".join(f"ours/{p}" for p in sides[1:]) + " |",
             "|---|" + "---:|" * (2 * len(sides) - 1)]
    row = [f"{s['apply_per_s'][x]:,.0f}" for x in sides]
    rat = [f"{s['ratios'][f'ours/{p}']['apply']:.2f}" for p in sides[1:]]
    lines.append("| apply_async (`delay`), one producer | " + " | ".join(row + rat) + " |")
    if s.get("apply_bound_per_s"):
        lines.append(f"| apply_async on kombu's `memory://` (no broker: the bound for any transport) | "
                     f"{s['apply_bound_per_s']:,.0f} |" + " |" * (2 * len(sides) - 2))
    for name, by_side in s["drain_per_s"].items():
        row = [f"{by_side[x]:,.0f}" if x in by_side else "—" for x in sides]
        rat = [f"{s['ratios'][f'ours/{p}'].get(f'drain {name}', float('nan')):.2f}" for p in sides[1:]]
        lines.append(f"| drain, one worker, {name} | " + " | ".join(row + rat) + " |")
    lines += ["", "| CPU µs per task (median): client or worker + server | " + " | ".join(sides) + " |",
              "|---|" + "---:|" * len(sides)]
    keys = ["apply"] + [k for k in s["drain_per_s"]]
    for k in keys:
        label = "apply_async: producer + server" if k == "apply" else f"drain {k}: worker + server"
        cells = []
        for x in sides:
            c = s["cpu_us"][x]
            a, b = (c.get("apply client"), c.get("apply server")) if k == "apply" else \
                (c.get(f"drain {k} worker"), c.get(f"drain {k} server"))
            cells.append("—" if a is None else f"{a:,.0f} + {b:,.0f} = {a + b:,.0f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    if "events" in s:
        e = s["events"]
        lines += ["", "| event path (ours) | per s |", "|---|---:|",
                  f"| events sent, one `Producer.send` each | {e['send_per_s']:,.0f} |",
                  f"| events handled by an `@event_handler`, one worker | {e['handle_per_s']:,.0f} |",
                  f"| CPU µs per handled event: worker + broker | {e['handle_worker_cpu_us']:,.0f} + "
                  f"{e['handle_broker_cpu_us']:,.0f} |"]
        solo = s["drain_per_s"].get("solo", {})
        for x in sides:
            if x in solo:
                lines.append(f"| plain Celery task per event, solo worker, {x} | {solo[x]:,.0f} |")
    return "\n".join(lines)


def plot(s: dict[str, Any], sides: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = ["apply_async"] + [f"drain {k}" for k in s["drain_per_s"]]
    vals = {x: [s["apply_per_s"][x]] + [s["drain_per_s"][k].get(x, 0) for k in s["drain_per_s"]] for x in sides}
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / len(sides)
    colors = {"ours": "#2a7", "redis": "#c33", "rabbitmq": "#f90"}
    for i, x in enumerate(sides):
        pos = [g + i * width for g in range(len(groups))]
        a.bar(pos, vals[x], width, label=x, color=colors.get(x))
    a.set_xticks([g + width * (len(sides) - 1) / 2 for g in range(len(groups))], groups, rotation=15, fontsize=8)
    a.set_ylabel("tasks/s")
    a.set_title(title)
    a.legend()
    if "events" in s:
        solo = s["drain_per_s"].get("solo", {})
        names = ["@event_handler\n(ours)"] + [f"task\n{x}" for x in sides if x in solo]
        ys = [s["events"]["handle_per_s"]] + [solo[x] for x in sides if x in solo]
        b.bar(names, ys, color=["#175"] + [colors.get(x, "#888") for x in sides if x in solo])
        b.set_ylabel("events handled/s, one worker")
        b.set_title("per event: handler vs a task (solo)")
        b.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _folded_top(path: Path, top: int = 40) -> dict[str, Any]:
    """py-spy's raw (folded) output: samples per thread, and per function counted once per stack."""
    per_fn: dict[str, int] = {}
    threads: dict[str, int] = {}
    total = 0
    for line in path.read_text().splitlines():
        stack, _, n_ = line.rpartition(" ")
        n = int(n_)
        total += n
        frames = stack.split(";")
        threads[frames[0]] = threads.get(frames[0], 0) + n
        for fn in {f.split(" (")[0] for f in frames}:
            per_fn[fn] = per_fn.get(fn, 0) + n
    return {"samples": total, "threads": threads,
            "functions": dict(sorted(per_fn.items(), key=lambda kv: -kv[1])[:top])}


def profile(sides: list[Side], n: int, tmp: Path, broker_pid: int) -> dict[str, Any]:
    """cProfile of n `apply_async` calls on one shared producer per side (in this process), and py-spy (when
    installed) of one solo worker draining them and of our broker meanwhile: where the time goes."""
    import cProfile
    import pstats

    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    have_spy = Path(spy).exists()
    out: dict[str, Any] = {}
    for side in sides:
        queue = f"bench.celery.{os.getpid()}.profile.{side.name}"
        app = make_app(side.url, queue)
        task = app.tasks[TASK]
        try:
            with app.producer_or_acquire() as producer:
                for i in range(50):
                    task.apply_async((n + i,), producer=producer)
                prof = cProfile.Profile()
                t0 = time.perf_counter()
                prof.enable()
                for i in range(n):
                    task.apply_async((i,), producer=producer)
                prof.disable()
                wall = time.perf_counter() - t0
            kombu.pools.reset()
            stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
            rows = sorted(((f"{Path(k[0]).name}:{k[1]}({k[2]})", v[3] / n * 1e6, v[2] / n * 1e6)
                           for k, v in stats.items()), key=lambda r: -r[1])[:40]
            res: dict[str, Any] = {"apply_us_profiled": wall / n * 1e6,
                                   "apply_top_cumulative_us": [{"fn": f, "cum_us": c, "own_us": o} for f, c, o in rows]}
            if have_spy:
                sink = tmp / f"sink-profile-{side.name}"
                sink.mkdir()
                w = start_worker(side.url, queue, sink, "solo", False)
                try:
                    while sink_count(str(sink)) < min(50, n // 10):
                        if w.poll() is not None:
                            raise RuntimeError(stop_worker(w))
                        time.sleep(0.01)
                    spies = [(name, pid, tmp / f"spy-{side.name}-{name}.txt")
                             for name, pid in [("worker", w.pid)] + ([("broker", broker_pid)] if side.name == "ours" else [])]
                    procs = [subprocess.Popen([spy, "record", "-p", str(pid), "-r", "200", "-f", "raw", "-o", str(f),
                                               "--threads", *(["--gil"] if name == "broker" else ["--idle"])],
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                             for name, pid, f in spies]
                    wait_sink(sink, int(n * 0.9), w, timeout=max(120.0, n / 20))
                    for p in procs:
                        p.send_signal(signal.SIGINT)
                        p.wait(30)
                    wait_sink(sink, n + 50, w, timeout=max(120.0, n / 20))
                finally:
                    stop_worker(w)
                for name, _, f in spies:
                    if f.exists():
                        res[f"drain_{name}_pyspy"] = _folded_top(f)
            out[side.name] = res
            print(f"profiled {side.name}: apply {res['apply_us_profiled']:.0f} µs/call under cProfile", flush=True)
        finally:
            side.delete_queue(queue)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 tasks, 1 round (a smoke run)")
    ap.add_argument("--tasks", type=int, default=None, help="tasks per variant (default 5,000; quick 1,000)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 2; quick 1)")
    ap.add_argument("--only", action="append", choices=["apply", "drain", "events"],
                    help="apply: fills only with the solo worker (no pool/acks variants); events: only the "
                         "event path")
    ap.add_argument("--no-redis", action="store_true")
    ap.add_argument("--no-rabbit", action="store_true")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--replot", default=None, help="redraw the PNG of a result JSON and exit")
    ap.add_argument("--profile", action="store_true",
                    help="instead of the benchmark: cProfile of apply_async and py-spy (if installed) of a solo "
                         "worker's drain and of our broker, per side; writes results/celery-profile-<date>.json")
    args = ap.parse_args(argv)
    if args.replot:
        r = json.loads(Path(args.replot).read_text())
        names = [x for x in ("ours", "redis", "rabbitmq") if x in r["summary"]["apply_per_s"]]
        plot(r["summary"], names, Path(args.out) / f"celery{'-quick' if args.quick else ''}.png",
             f"Celery: one producer, one worker (N={r['tasks']:,}, {r['rounds']} rounds; load "
             f"{r['load_before'][0]:.0f}→{r['load_after'][0]:.0f} on 2 vCPUs)")
        return
    n = args.tasks or (1000 if args.quick else 5000)
    rounds = args.rounds or (1 if args.quick else 2)
    only = set(args.only or ["apply", "drain", "events"])
    load_before = os.getloadavg()
    t_run = time.time()
    peers = [Side("redis", REDIS_URL, pids_named("redis-server"))] if not args.no_redis else []
    peers += [Side("rabbitmq", RABBIT_URL, pids_named("beam.smp"))] if not args.no_rabbit else []
    skipped = {}
    for p in list(peers):
        why = reachable(p)
        if why:
            skipped[p.name] = why
            peers.remove(p)
            print(f"{p.name}: skipped ({why})")
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="celery-", dir=base))
    runs: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    bounds: list[float] = []
    failures: list[dict[str, Any]] = []
    variants = [(pool, late) for pool in POOLS for late in (False, True)]
    if "drain" not in only:
        variants = [("solo", False)] if "apply" in only else []
    if args.profile:
        try:
            with broker_process(tmp / "store") as (broker, ns):
                prof = profile([Side("ours", f"rocketmq://{ns}//", [broker.pid]), *peers], n, tmp, broker.pid)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        path = Path(args.out) / f"celery-profile-{time.strftime('%Y-%m-%d')}.json"
        path.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_run)), "tasks": n,
                                    "load_before": load_before, "load_after": os.getloadavg(), "profile": prof},
                                   indent=1))
        print(f"wrote {path}")
        return
    try:
        with broker_process(tmp / "store") as (broker, ns):
            sides = [Side("ours", f"rocketmq://{ns}//", [broker.pid]), *peers]
            k = 0
            for r in range(rounds):
                if "apply" in only:
                    bounds.append(apply_bound(n))
                    print(f"round {r + 1}/{rounds} apply_async on memory:// (no broker: the bound) "
                          f"{bounds[-1]:7,.0f}/s", flush=True)
                for pool, late in variants:
                    order = sides[k % len(sides):] + sides[:k % len(sides)]
                    k += 1
                    for side in order:
                        queue = f"bench.celery.{os.getpid()}.{k}.{side.name}"
                        try:
                            st = apply_and_drain(side, queue, n, pool, late, tmp)
                        except Exception as e:  # one failed variant is reported; the run goes on
                            failures.append({"side": side.name, "pool": pool, "acks_late": late, "round": r,
                                             "error": f"{type(e).__name__}: {e}"[-3000:]})
                            print(f"round {r + 1}/{rounds} {side.name:8s} {pool:7s} acks_late={late!s:5s} "
                                  f"FAILED: {failures[-1]['error'][:300]}", flush=True)
                            continue
                        finally:
                            side.delete_queue(queue)
                        st["round"] = r
                        runs.append(st)
                        print(f"round {r + 1}/{rounds} {side.name:8s} {pool:7s} acks_late={late!s:5s} "
                              f"apply {st['apply_per_s']:7,.0f}/s  drain {st['drain_per_s']:7,.0f}/s  CPU µs/task "
                              f"apply {st['apply_cpu']['client_us']:.0f}+{st['apply_cpu']['server_us']:.0f} drain "
                              f"{st['drain_cpu']['worker_us']:.0f}+{st['drain_cpu']['server_us']:.0f} "
                              f"(missing {st['missing']}, duplicates {st['duplicates']}, boot→first "
                              f"{st['boot_to_first_s']:.2f} s)", flush=True)
                if "events" in only:
                    e = event_path(ns, broker.pid, n, tmp)
                    e["round"] = r
                    events.append(e)
                    print(f"round {r + 1}/{rounds} events   send {e['send_per_s']:7,.0f}/s  handled "
                          f"{e['drain_per_s']:7,.0f}/s (missing {e['missing']}, duplicates {e['duplicates']})",
                          flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    names = ["ours", *[p.name for p in peers]]
    summary = summarize(runs, events, names) if runs else {"events": summarize([], events, names).get("events")}
    if bounds:
        summary["apply_bound_per_s"] = med(bounds)
    md = markdown(summary, names, n, rounds) if runs else ""
    print("\n" + md)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_run)), "seconds": time.time() - t_run,
              "tasks": n, "rounds": rounds, "machine": {"node": os.uname().nodename, "cores": os.cpu_count()},
              "load_before": load_before, "load_after": os.getloadavg(), "skipped_peers": skipped, "failures": failures,
              "runs": runs, "events": events, "summary": summary, "markdown": md}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    suffix = "-quick" if args.quick else ""
    path = out / f"celery-{time.strftime('%Y-%m-%d')}{suffix}.json"
    path.write_text(json.dumps(result, indent=1))
    if runs:
        plot(summary, names, out / f"celery{suffix}.png",
             f"Celery: one producer, one worker (N={n:,}, {rounds} round{'s' if rounds > 1 else ''}; load "
             f"{load_before[0]:.0f}→{result['load_after'][0]:.0f} on 2 vCPUs)")
    print(f"wrote {path} ({result['seconds']:.0f} s; load {load_before[0]:.1f} → {result['load_after'][0]:.1f})")


if __name__ == "__main__":
    main()
