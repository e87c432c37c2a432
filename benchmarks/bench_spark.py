"""Scan throughput of the `rocketmq` Spark source vs a single-process Python scan of the same files.

One run on one machine measures, on one store of a few hundred MB written by our `MessageStore`:

* `python engine iter_records`: the engine's `StoreReader.iter_records` (every record checked with
  `checkMessageAndReturnSize`, a `DispatchRequest` built; no body copy) in this process;
* `python engine iter_messages`: the engine's full decode to `MessageExt` (body, properties parsed
  lazily) in this process;
* `python numpy decoder` and `python C decoder`: our `decode.iter_batches` (all 19 columns as Arrow) in
  this process, on the numpy decoder (`RMQ_EVENTSTORE_PURE=1`'s path) and on `_spark_native`;
* Spark `local[1]` and `local[2]`: `spark.read.format("rocketmq")` written to the `noop` sink (every
  row materialised), each master in a fresh process (one JVM each), a warm-up query first; once with
  `RMQ_EVENTSTORE_PURE=1` (numpy decoder in the Python workers: "before") and once with the C decoder;
* the topic pushdown: `where topic = 'TopicA'` with pushdown off (Spark filters a full scan) and on
  (the source reads that topic's consume queues and only the records they point to), local[2];
* Spark `local[1]` and `local[2]` on the JVM reader, `spark.read.format("rocketmq-jvm")` (columnar
  batches decoded in the JVM: no Python worker), when its jar is built or `javac` can build it.

Best of N after a warm-up; wall seconds, MB/s and rows/s, and CPU seconds of the whole process tree
(driver, JVM, Python workers; from /proc). The store is kept under `var/bench-spark/` for reuse (never
committed). Results: `benchmarks/results/spark-<date>.json` and `benchmarks/results/spark-throughput.png`.

    .venv/bin/python benchmarks/bench_spark.py [--mb 300] [--reps 3] [--quick] [--jvm-only]

`--jvm-only` runs only the two `rocketmq-jvm` children (results in `spark-<date>-jvm.json`); each Spark
run also reports the CPU seconds of Spark's task threads (`task_cpu_s_min`), which moves least when other
jobs share the cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TOPICS = [f"Topic{c}" for c in "ABCDEFGH"]
SEGMENT = 128 * 1024 * 1024
CLK_TCK = os.sysconf("SC_CLK_TCK")


# -- process-tree CPU ------------------------------------------------------------------------------
def _children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kids.setdefault(int(parts[1]), []).append(int(name))
    return kids


def tree_cpu(pid: int | None = None) -> float:
    """User + system CPU seconds of `pid` (default: this process) and all its live descendants."""
    kids = _children()
    todo = [pid or os.getpid()]
    total = 0
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as fh:
                parts = fh.read().rsplit(")", 1)[1].split()
            total += int(parts[11]) + int(parts[12])  # utime, stime
        except OSError:
            pass
        todo += kids.get(p, [])
    return total / CLK_TCK


# -- the store -------------------------------------------------------------------------------------
def build_store(path: Path, mb: int) -> dict[str, Any]:
    """A store of about `mb` MB (reused when it is already there with at least that much)."""
    from tqdm import tqdm

    from rmq_eventstore.store import Message, MessageStore

    marker = path / "bench-spark.json"
    if marker.exists():
        info = json.loads(marker.read_text())
        if info["mb"] >= mb:
            return info
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    target = mb * 1024 * 1024
    written = n = 0
    batch = 512
    with MessageStore.open(path, mapped_file_size_commit_log=SEGMENT, message_index_enable=False) as store, \
            tqdm(total=target, unit="B", unit_scale=True, desc="build store") as bar:
        while written < target:
            msgs = [Message(topic=TOPICS[(n + i) % 8], body=(b'{"order": %d, "amount": %d, "status": "paid"}'
                                                             % (n + i, (n + i) * 7 % 1000)) * 2,
                            tags=f"tag{(n + i) % 5}", keys=f"order-{(n + i) % 100000}", queue_id=(n + i) % 4)
                    for i in range(batch)]
            r = store.put_messages(msgs)
            assert r.is_ok(), r
            before = written
            written = store.get_max_phy_offset()
            n += batch
            bar.update(written - before)
        store.wait_for_dispatch(60)
    info = {"mb": mb, "bytes": written, "messages": n}
    marker.write_text(json.dumps(info))
    return info


# -- single-process Python scans ---------------------------------------------------------------------
def python_scans(path: Path, reps: int) -> list[dict[str, Any]]:
    import mmap

    import numpy as np

    from rmq_eventstore.spark import decode
    from rmq_eventstore.spark.source import list_segments
    from rmq_eventstore.store import StoreReader

    def engine_records() -> int:
        with StoreReader(path) as r:
            return sum(1 for _o, res in r.iter_records() if res.success)

    def engine_messages() -> int:
        with StoreReader(path) as r:
            return sum(1 for _m in r.iter_messages())

    def numpy_decoder() -> int:
        saved = decode._native
        decode._native = None
        try:
            return c_decoder()
        finally:
            decode._native = saved

    def c_decoder() -> int:
        rows = 0
        segs, _ = list_segments(str(path / "commitlog"))
        for p, base, size in segs:
            with open(p, "rb") as fh:
                mm = mmap.mmap(fh.fileno(), size, access=mmap.ACCESS_READ)
            a = np.frombuffer(mm, dtype=np.uint8)
            for d in decode.iter_batches(memoryview(mm), a, base, 0, size):
                rows += d.batch.num_rows if d.batch is not None else 0
        return rows

    out = []
    for name, fn, n in (("python engine iter_records", engine_records, reps),
                        ("python engine iter_messages", engine_messages, 1),
                        ("python numpy decoder", numpy_decoder, reps),
                        *((("python C decoder", c_decoder, reps),) if decode.NATIVE else ())):
        runs = []
        for _ in range(n):
            c0, t0 = tree_cpu(), time.perf_counter()
            rows = fn()
            runs.append({"wall": time.perf_counter() - t0, "cpu": tree_cpu() - c0, "rows": rows})
            print(f"  {name}: {runs[-1]['wall']:.2f} s, {rows} rows", flush=True)
        out.append({"name": name, "cores": 1, "runs": runs})
    return out


# -- Spark (one process per master) --------------------------------------------------------------------
def spark_child(args: argparse.Namespace) -> None:
    """Runs in a fresh process: one SparkSession with `args.master`, prints a JSON list of results."""
    from rmq_eventstore.spark.session import local_session

    spark = local_session(master=args.master, app_name="bench-spark")
    path = str(args.store)
    cores = int(args.master[6:-1])

    mx = spark._jvm.java.lang.management.ManagementFactory.getThreadMXBean()
    seen: dict[int, int] = {}

    def task_cpu() -> float:
        """CPU seconds of Spark's task threads so far: the scan's own work, without the JIT compiler, the
        collector and the driver (steadier than wall or process CPU when other jobs share the cores)."""
        for t in spark._jvm.java.lang.Thread.getAllStackTraces().keySet().toArray():
            if t.getName().startswith("Executor task"):
                c = mx.getThreadCpuTime(t.getId())
                if c >= 0:
                    seen[t.getId()] = c
        return sum(seen.values()) / 1e9

    def run(df: Any) -> float:
        t0 = time.perf_counter()
        df.write.format("noop").mode("overwrite").save()
        return time.perf_counter() - t0

    def measure(name: str, make: Any, pushdown: str) -> dict[str, Any]:
        spark.conf.set("spark.sql.python.filterPushdown.enabled", pushdown)
        runs = []
        for _ in range(args.reps):
            k0, c0 = task_cpu(), tree_cpu()
            wall = run(make())
            runs.append({"wall": wall, "cpu": tree_cpu() - c0, "task_cpu": task_cpu() - k0})
        rows = make().count()
        for r in runs:
            r["rows"] = rows
        print(f"  {name}: best {min(r['wall'] for r in runs):.2f} s, task CPU min "
              f"{min(r['task_cpu'] for r in runs):.3f} s, {rows} rows", file=sys.stderr, flush=True)
        return {"name": name, "cores": cores, "runs": runs}

    reader = lambda: spark.read.format(args.format).load(path)  # noqa: E731
    t0 = time.perf_counter()
    reader().write.format("noop").mode("overwrite").save()  # warm-up: workers, imports, JIT
    warm = time.perf_counter() - t0
    results = [measure(f"spark local[{cores}] full scan", reader, "true")]
    if args.pushdown:
        topic = lambda: reader().where("topic = 'TopicA'")  # noqa: E731
        results.append(measure(f"spark local[{cores}] topic filter, pushdown off", topic, "false"))
        results.append(measure(f"spark local[{cores}] topic filter, pushdown on", topic, "true"))
    results[0]["warmup_wall"] = warm
    spark.stop()
    print(json.dumps(results))


def spark_runs(store: Path, master: str, reps: int, pushdown: bool, pure: bool,
               fmt: str = "rocketmq") -> list[dict[str, Any]]:
    cmd = [sys.executable, __file__, "--child", "--master", master, "--store", str(store), "--reps", str(reps),
           "--format", fmt]
    if pushdown:
        cmd.append("--pushdown")
    env = dict(os.environ)
    env.pop("RMQ_EVENTSTORE_PURE", None)
    if pure:
        env["RMQ_EVENTSTORE_PURE"] = "1"  # the Python workers inherit it: numpy decoder
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=900, check=True, env=env)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    for r in out:
        r["name"] += ", JVM reader (rocketmq-jvm)" if fmt != "rocketmq" else ", numpy decoder" if pure \
            else ", C decoder"
    return out


# -- report -----------------------------------------------------------------------------------------
def summarise(results: list[dict[str, Any]], nbytes: int) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        best = min(r["runs"], key=lambda x: x["wall"])
        rows.append({"name": r["name"], "cores": r["cores"], "best_wall_s": round(best["wall"], 3),
                     "cpu_s": round(best["cpu"], 2), "rows": best["rows"],
                     **({"task_cpu_s_min": round(min(x["task_cpu"] for x in r["runs"]), 3)}
                        if all("task_cpu" in x for x in r["runs"]) else {}),
                     "mb_per_s": round(nbytes / 1e6 / best["wall"], 1),
                     "rows_per_s": round(best["rows"] / best["wall"]),
                     "mb_per_s_per_core": round(nbytes / 1e6 / best["wall"] / r["cores"], 1),
                     "walls": [round(x["wall"], 3) for x in r["runs"]]})
    return rows


def markdown(rows: list[dict[str, Any]], baseline: str, versus: str = "engine scan") -> str:
    base = next(r for r in rows if r["name"] == baseline)
    lines = [f"| path | cores | best wall s | MB/s | MB/s per core | rows/s | tree CPU s | vs {versus} |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['cores']} | {r['best_wall_s']} | {r['mb_per_s']} | "
                     f"{r['mb_per_s_per_core']} | {r['rows_per_s']:,} | {r['cpu_s']} | "
                     f"{base['best_wall_s'] / r['best_wall_s']:.2f}x |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = [r["name"] for r in rows]
    vals = [r["mb_per_s_per_core"] for r in rows]
    ax.barh(names, vals, color=["#888" if n.startswith("python") else "#1f77b4" for n in names])
    ax.axvline(250, color="red", linestyle="--", linewidth=1, label="target 250 MB/s per core")
    ax.set_xlabel("MB/s per core of commitlog scanned (best of N; filtered rows: MB of the whole store)")
    ax.invert_yaxis()
    ax.legend(loc="lower right")
    ax.set_title("rocketmq Spark source vs single-process Python scan")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=300, help="store size in MB (default 300)")
    ap.add_argument("--reps", type=int, default=3, help="timed runs per variant (best is reported)")
    ap.add_argument("--quick", action="store_true", help="64 MB store, 2 reps")
    ap.add_argument("--store", type=Path, default=ROOT / "var" / "bench-spark")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--master", default="local[2]", help=argparse.SUPPRESS)
    ap.add_argument("--pushdown", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--format", default="rocketmq", help=argparse.SUPPRESS)
    ap.add_argument("--jvm-only", action="store_true",
                    help="only the rocketmq-jvm runs (local[1], local[2]), no Python scans or Python source")
    ap.add_argument("--no-pushdown", dest="pushdown_runs", action="store_false",
                    help="skip the topic-filter runs (pushdown off / on)")
    args = ap.parse_args()
    if args.child:
        spark_child(args)
        return
    if args.quick:
        args.mb, args.reps = 64, 2
        args.store = args.store.with_name(args.store.name + "-quick")
    t0 = time.time()
    load_before = os.getloadavg()
    info = build_store(args.store, args.mb)
    nbytes = info["bytes"]
    print(f"store: {nbytes / 1e6:.0f} MB, {info['messages']} messages in {args.store}", flush=True)
    results = [] if args.jvm_only else python_scans(args.store, args.reps)
    for pure in () if args.jvm_only else (True, False):
        for master in ("local[1]", "local[2]"):
            print(f"spark {master} {'numpy' if pure else 'C'} decoder ...", flush=True)
            results += spark_runs(args.store, master, args.reps, args.pushdown_runs and master == "local[2]" and not pure, pure)
    from rmq_eventstore.spark import jvm

    if jvm.build() is not None:
        for master in ("local[1]", "local[2]"):
            print(f"spark {master} JVM reader ...", flush=True)
            results += spark_runs(args.store, master, args.reps, False, False, jvm.FORMAT)
    else:
        print("no JVM reader jar and no javac: skipping the rocketmq-jvm runs", flush=True)
        if args.jvm_only:
            sys.exit(1)
    rows = summarise(results, nbytes)
    table = markdown(rows, "python engine iter_records") if not args.jvm_only else \
        markdown(rows, rows[0]["name"], "local[1]")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    suffix = ("-quick" if args.quick else "") + ("-jvm" if args.jvm_only else "")
    doc = {"date": date.today().isoformat(), "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                                                         "platform": platform.platform()},
           "load_before": load_before, "load_after": os.getloadavg(), "store": info, "reps": args.reps,
           "results": rows, "raw": results, "markdown": table, "seconds": round(time.time() - t0, 1)}
    (args.out / f"spark-{date.today().isoformat()}{suffix}.json").write_text(json.dumps(doc, indent=2))
    plot(rows, args.out / f"spark-throughput{suffix}.png")
    print(f"wrote {args.out}/spark-{date.today().isoformat()}{suffix}.json and spark-throughput{suffix}.png")


if __name__ == "__main__":
    main()
