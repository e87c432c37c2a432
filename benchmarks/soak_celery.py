"""Soak: N Celery tasks through W worker processes on our transport; nothing lost, memory flat.

    python benchmarks/soak_celery.py [--tasks 1000000] [--workers 4] [--pool solo] [--max-minutes M]

- Our broker (`rmq-eventstore serve`) runs in a child process on a fresh store under ``var/bench/``; W
  ``celery worker`` processes (``-P solo`` each, or ``--pool prefork --concurrency C``) consume one queue.
- This process publishes tasks ``bench.it(seq)`` for seq = 0..N-1 (``apply_async`` on one producer),
  keeping at most ``--window`` tasks published and not yet run, so the run is a steady state and not a
  backlog. ``--max-minutes`` stops publishing early; the report then says how many were published.
- Every run of a task appends (seq, time) to its process's file in a sink directory (celery_bench_app.py).
  At the end (all published tasks ran, or nothing ran for ``--stall`` seconds) the workers are stopped and
  the sink is counted by seq: missing (published, never ran) and duplicates (ran more than once).
- Every ``--sample`` seconds: RSS (VmRSS, and RssAnon: the heap, what a leak grows) of the broker and of
  each worker process (its pool children too), tasks published and run. Plotted over time.

Writes ``benchmarks/results/soak-celery-<date>[-<N>].json`` and ``soak-celery.png`` (or ``--out``). Exit
status 1 when a task is missing or ran twice.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from benchlib import broker_process  # noqa: E402

from benchmarks.celery_bench_app import TASK, make_app, read_sink, sink_count  # noqa: E402

QUEUE = "bench.soak"


def rss_kib(pid: int) -> dict[str, int] | None:
    """VmRSS, RssAnon and RssFile (KiB) of `pid`, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("VmRSS", "RssAnon", "RssFile")))
    except (FileNotFoundError, ProcessLookupError):
        return None
    return {k: int(v.split()[0]) for k, v in fields.items()}


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


class Sampler(threading.Thread):
    """Samples RSS of the broker and the workers (and their pool children) every `every` seconds."""

    def __init__(self, broker_pid: int, workers: list[subprocess.Popen], sink: Path, every: float,
                 published: list[int]) -> None:
        super().__init__(daemon=True, name="rss-sampler")
        self.broker_pid = broker_pid
        self.workers = workers
        self.sink = sink
        self.every = every
        self.published = published
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def sample(self) -> None:
        procs = {"broker": self.broker_pid}
        for i, w in enumerate(self.workers):
            procs[f"worker{i}"] = w.pid
            for j, c in enumerate(children(w.pid)):
                procs[f"worker{i}.child{j}"] = c
        rss = {name: r for name, pid in procs.items() if (r := rss_kib(pid)) is not None}
        self.samples.append({"t": time.monotonic() - self.t0, "published": self.published[0],
                             "ran": sink_count(str(self.sink)), "rss_kib": rss, "load": os.getloadavg()[0]})

    def run(self) -> None:
        while not self.stop.wait(self.every):
            self.sample()


def start_worker(url: str, sink: Path, i: int, pool: str, concurrency: int) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT), BENCH_BROKER=url, BENCH_QUEUE=QUEUE, BENCH_SINK=str(sink))
    pool_args = ["-P", "solo"] if pool == "solo" else ["-P", pool, "-c", str(concurrency)]
    cmd = [sys.executable, "-m", "celery", "-A", "benchmarks.celery_bench_app", "worker", *pool_args, "-Q", QUEUE,
           "-n", f"soak{i}-{os.getpid()}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
           "-l", "WARNING"]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def stop_workers(workers: list[subprocess.Popen]) -> list[str]:
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    errs = []
    for w in workers:
        try:
            _, err = w.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(w.pid, signal.SIGKILL)
            _, err = w.communicate()
        errs.append((err or "")[-3000:])
    return errs


def growth(samples: list[dict[str, Any]], name: str, field: str = "RssAnon") -> dict[str, float] | None:
    """RSS of `name` (MiB) after the first quarter of the run and at its end, and the slope of a straight
    line through the second half (MiB per 100,000 tasks run)."""
    pts = [(s["ran"], s["rss_kib"][name][field] / 1024) for s in samples if name in s["rss_kib"]]
    if len(pts) < 8:
        return None
    q = pts[len(pts) // 4]
    half = pts[len(pts) // 2:]
    xs = [p[0] for p in half]
    ys = [p[1] for p in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den * 100_000 if den else 0.0
    return {"at_quarter_mib": q[1], "end_mib": pts[-1][1], "max_mib": max(p[1] for p in pts),
            "slope_mib_per_100k_second_half": slope}


def plot(result: dict[str, Any], path: Path) -> None:
    """Three panels: the heap (RssAnon) and RSS of every process; the broker's mapped store files (RssFile:
    page cache of the commitlog it maps, which grows with the data, not a leak); tasks and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = result["samples"]
    fig, (a, f, b) = plt.subplots(3, 1, figsize=(11, 9), sharex=True, gridspec_kw={"height_ratios": [2, 1, 1]})
    t = [s["t"] / 60 for s in samples]
    names = sorted({n for s in samples for n in s["rss_kib"]}, key=lambda n: (n != "broker", n))

    def series(name: str, field: str) -> list[float | None]:
        return [s["rss_kib"][name][field] / 1024 if name in s["rss_kib"] else None for s in samples]

    for name in names:
        line, = a.plot(t, series(name, "RssAnon"), lw=1.4 if name == "broker" else 0.9, label=f"{name} heap (RssAnon)")
        if name != "broker":
            a.plot(t, series(name, "VmRSS"), ":", color=line.get_color(), lw=0.9, label=f"{name} RSS")
    a.set_ylabel("MiB")
    a.set_ylim(bottom=0)
    a.set_title(f"Soak: {result['ran_distinct']:,} tasks through {result['workers']} {result['pool']} workers on our "
                f"transport (missing {result['missing']}, duplicates {result['duplicates']})")
    a.legend(fontsize=7, ncol=3, loc="lower right")
    f.plot(t, series("broker", "VmRSS"), label="broker RSS")
    f.plot(t, series("broker", "RssFile"), "--", label="of which mapped store files (RssFile)")
    f.set_ylabel("MiB")
    f.legend(fontsize=8, loc="upper left")
    b.plot(t, [s["published"] for s in samples], label="published")
    b.plot(t, [s["ran"] for s in samples], label="ran")
    b2 = b.twinx()
    b2.plot(t, [s["load"] for s in samples], color="#999", lw=0.7, label="load average (1 min)")
    b2.set_ylabel("load")
    b.set_xlabel("minutes")
    b.set_ylabel("tasks")
    b.legend(loc="upper left", fontsize=8)
    b2.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=1_000_000)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--pool", default="solo", choices=["solo", "prefork", "threads"])
    ap.add_argument("--concurrency", type=int, default=2, help="per worker, for --pool prefork/threads")
    ap.add_argument("--window", type=int, default=20_000, help="most tasks published and not yet run")
    ap.add_argument("--sample", type=float, default=5.0, help="seconds between RSS samples")
    ap.add_argument("--max-minutes", type=float, default=None, help="stop publishing after this long")
    ap.add_argument("--stall", type=float, default=120.0, help="give up when nothing ran for this long (s)")
    ap.add_argument("--out", default=str(HERE / "results"))
    ap.add_argument("--name", default=None, help="file name stem (default soak-celery-<date>)")
    ap.add_argument("--replot", default=None, help="redraw the PNG of a result JSON and exit")
    args = ap.parse_args(argv)
    if args.replot:
        plot(json.loads(Path(args.replot).read_text()), Path(args.replot).with_suffix(".png"))
        return 0
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="soak-", dir=base))
    sink = tmp / "sink"
    sink.mkdir()
    published = [0]
    t_start = time.time()
    load_before = os.getloadavg()
    stopped_early = False
    errs: list[str] = []
    try:
        with broker_process(tmp / "store") as (broker, ns):
            url = f"rocketmq://{ns}//"
            app = make_app(url, QUEUE)
            task = app.tasks[TASK]
            with app.connection_for_write() as conn:
                app.amqp.queues[QUEUE].bind(conn.default_channel).declare()
            workers = [start_worker(url, sink, i, args.pool, args.concurrency) for i in range(args.workers)]
            sampler = Sampler(broker.pid, workers, sink, args.sample, published)
            sampler.sample()
            sampler.start()
            deadline = None if args.max_minutes is None else time.monotonic() + args.max_minutes * 60
            try:
                with app.producer_or_acquire() as producer:
                    ran = 0
                    last_report = time.monotonic()
                    for seq in range(args.tasks):
                        if seq - ran >= args.window:  # keep the backlog bounded
                            while seq - (ran := sink_count(str(sink))) >= args.window // 2:
                                if any(w.poll() is not None for w in workers):
                                    raise RuntimeError("a worker exited: " + " | ".join(stop_workers(workers)))
                                time.sleep(0.05)
                        task.apply_async((seq,), producer=producer)
                        published[0] = seq + 1
                        if time.monotonic() - last_report > 30:
                            last_report = time.monotonic()
                            print(f"{(time.time() - t_start) / 60:6.1f} min: published {published[0]:,}, ran "
                                  f"{sink_count(str(sink)):,}", flush=True)
                        if deadline is not None and time.monotonic() > deadline:
                            stopped_early = True
                            break
                last, last_change = -1, time.monotonic()
                while (got := sink_count(str(sink))) < published[0] and time.monotonic() - last_change < args.stall:
                    if got != last:
                        last, last_change = got, time.monotonic()
                    time.sleep(0.2)
                time.sleep(min(5.0, args.sample))  # a late duplicate gets a chance to show
                sampler.sample()
            finally:
                sampler.stop.set()
                sampler.join()
                errs = stop_workers(workers)
            left = None
            try:
                with make_app(url, QUEUE).connection_for_write() as conn:
                    left = conn.default_channel._size(QUEUE)
            except Exception as e:  # reported, not fatal
                left = f"{type(e).__name__}: {e}"
        recs = read_sink(str(sink))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    counts: dict[int, int] = {}
    for seq, _ in recs:
        counts[seq] = counts.get(seq, 0) + 1
    n = published[0]
    missing = sum(1 for s in range(n) if s not in counts)
    duplicates = sum(c - 1 for c in counts.values() if c > 1)
    times = sorted(t for _, t in recs)
    samples = sampler.samples
    names = sorted({k for s in samples for k in s["rss_kib"]})
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "tasks_asked": args.tasks,
        "published": n, "stopped_early": stopped_early, "ran": len(recs), "ran_distinct": len(counts),
        "missing": missing, "duplicates": duplicates, "unknown": sum(1 for s in counts if not 0 <= s < n),
        "queue_left": left, "workers": args.workers, "pool": args.pool, "window": args.window,
        "seconds": time.time() - t_start, "rate_per_s": (len(recs) - 1) / (times[-1] - times[0]) if len(times) > 1 else 0,
        "machine": {"node": os.uname().nodename, "cores": os.cpu_count()}, "load_before": load_before,
        "load_after": os.getloadavg(), "rss_growth": {k: growth(samples, k) for k in names},
        "worker_stderr": [e for e in errs if "Traceback" in e or "ERROR" in e or "CRITICAL" in e], "samples": samples,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = args.name or f"soak-celery-{time.strftime('%Y-%m-%d')}"
    (out / f"{stem}.json").write_text(json.dumps(result, indent=1))
    plot(result, out / f"{stem}.png")
    print(json.dumps({k: v for k, v in result.items() if k not in ("samples", "worker_stderr")}, indent=1))
    print(f"wrote {out / stem}.json and .png")
    return 1 if missing or duplicates else 0


if __name__ == "__main__":
    sys.exit(main())
