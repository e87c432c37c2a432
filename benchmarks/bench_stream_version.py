"""What expected-version appends cost: conditional vs plain appends, single and batched, in ONE run.

    python benchmarks/bench_stream_version.py [--quick] [--out benchmarks/results]

* through the broker: `rmq-eventstore serve` in a child process (client and broker do not share a GIL),
  our `Producer` over loopback;
* embedded: `Broker.send_messages` in-process (the same check-and-append, no sockets).

Variants, each interleaved over several rounds and reported as the median: plain sends; stream appends
without a check (`stream=`, the broker still numbers them); conditional appends (`expected_version=`) on
one stream and spread over 1,000 streams (the version cache stays warm either way), single and batched x100.
Bodies are 200 bytes. Stores live under `var/bench/` and are deleted afterwards; only 127.0.0.1 is used.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchlib import broker_process  # noqa: E402

from rmq_eventstore.broker import Broker  # noqa: E402
from rmq_eventstore.client import Message, Producer  # noqa: E402
from rmq_eventstore.store import MessageStore  # noqa: E402

BODY = b"x" * 200


def timed(fn, n: int) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def broker_variants(p: Producer, n: int, batch: int, tag: str) -> dict[str, callable]:
    versions: dict[str, int] = {}

    def plain_single() -> None:
        for _ in range(n):
            p.send(Message("plain", BODY), queue_id=0)

    def stream_single(streams: int, check: bool) -> callable:
        def run() -> None:
            for i in range(n):
                s = f"{tag}-{streams}-{check}-{i % streams}"
                v = versions.get(s, 0)
                p.send(Message("streams", BODY), stream=s, expected_version=v if check else None)
                versions[s] = v + 1
        return run

    def plain_batch() -> None:
        for _ in range(n // batch):
            p.send_batch([Message("plain", BODY)] * batch, queue_id=0)

    def stream_batch() -> None:
        s = f"{tag}-batch"
        for _ in range(n // batch):
            v = versions.get(s, 0)
            p.send_batch([Message("streams", BODY)] * batch, stream=s, expected_version=v)
            versions[s] = v + batch

    return {"plain send": plain_single, "stream append, no check": stream_single(1000, False),
            "conditional, one stream": stream_single(1, True),
            "conditional, 1,000 streams": stream_single(1000, True),
            f"plain batch x{batch}": plain_batch, f"conditional batch x{batch}": stream_batch}


def embedded_variants(b: Broker, n: int, tag: str) -> dict[str, callable]:
    def plain() -> None:
        for _ in range(n):
            b.send_messages([Message("plain", BODY, queue_id=0, properties_string="")])

    def conditional() -> None:
        for i in range(n):
            b.send_messages([Message("streams", BODY, queue_id=0, properties_string="")], stream=f"{tag}-e",
                            expected_version=i)

    return {"embedded plain": plain, "embedded conditional": conditional}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--reps", type=int, default=None)
    args = ap.parse_args()
    n = 2000 if args.quick else 10_000
    reps = args.reps or (3 if args.quick else 5)
    batch = 100
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="streams-", dir=base))
    results: dict[str, list[float]] = {}
    try:
        with broker_process(tmp / "broker") as (_, ns), Producer(ns, "bench") as p, \
                MessageStore.open(tmp / "embedded") as store:
            b = Broker(store)
            b.start()
            p.send(Message("plain", BODY), queue_id=0)
            p.send(Message("streams", BODY), stream="warm-up")
            for rep in range(reps):
                variants = {**broker_variants(p, n, batch, f"r{rep}"), **embedded_variants(b, n, f"r{rep}")}
                names = list(variants)
                rot = rep % len(names)
                for name in names[rot:] + names[:rot]:
                    results.setdefault(name, []).append(timed(variants[name], n))
                    print(f"  round {rep + 1}/{reps} {name}: {results[name][-1]:,.0f} msgs/s", flush=True)
            b.shutdown()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    rows = [("through the broker, single", "plain send", ["stream append, no check", "conditional, one stream",
                                                          "conditional, 1,000 streams"]),
            (f"through the broker, batch x{batch}", f"plain batch x{batch}", [f"conditional batch x{batch}"]),
            ("embedded (Broker.send_messages)", "embedded plain", ["embedded conditional"])]
    print(f"\n| path | variant | msgs/s (median of {reps}) | vs plain |\n|---|---|---:|---:|")
    for path, plain, others in rows:
        print(f"| {path} | {plain} | {med[plain]:,.0f} | 1.00 |")
        for o in others:
            print(f"| {path} | {o} | {med[o]:,.0f} | {med[o] / med[plain]:.2f} |")
    os.makedirs(args.out, exist_ok=True)
    out = Path(args.out) / f"stream-version-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps({"n": n, "reps": reps, "results": results, "median": med}, indent=1))
    plot(med, Path(args.out) / "stream-version.png")
    print(f"wrote {out}")


def plot(med: dict[str, float], path: Path) -> None:
    """A bar chart of the medians, plain and conditional side by side per path."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # the bench extra is not installed: the table is printed all the same
        return
    names = list(med)
    fig, ax = plt.subplots(figsize=(9, 4))
    colors = ["#4c72b0" if "plain" in n else "#dd8452" for n in names]
    ax.barh(names[::-1], [med[n] for n in names][::-1], color=colors[::-1])
    ax.set_xscale("log")
    ax.set_xlabel("messages/s (log scale; median)")
    ax.set_title("Expected-version appends vs plain appends (blue: plain)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
