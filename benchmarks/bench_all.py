"""`make bench`: every speed goal of issue 16 in ONE run, and the one table that says how close we are.

    python benchmarks/bench_all.py [--quick] [--runs N] [--skip NAME ...] [--no-readme]
    python benchmarks/bench_all.py --summarize DIR [DIR ...]   # only rebuild the table from runs' files

Runs, one after the other, each in its own process with a time limit and its output into one run
directory `benchmarks/results/run-<date>[-quick]/`:
  bounds    this machine's bounds, measured now: memcpy, CRC32, sequential disk write with fdatasync,
            fdatasync rate of 4 KiB appends, and the Python loopback round trip to an echo server on
            uvloop (the floor for any Python client's synchronous request);
  store     bench_store.py: embedded put (single, x100, x1000) beside the bare Python framing loop and
            Redis XADD; reads; the 10 M-append and 1 M-pull memory phases;
  sweep     bench_sweep.py: throughput against batch size and message size, store and Redis;
  broker    bench_broker.py: send single / batched, pull 32 / 256 over loopback beside Redis Streams;
  pop       bench_pop.py: POP + ACK beside Redis XREADGROUP + XACK;
  celery    bench_celery.py --only apply: Celery's apply_async on our transport beside Redis, and on kombu's
            in-process memory:// transport (the bound: what Celery itself costs);
  django    bench_django.py: a Django request that saves a row and appends an event in its transaction, beside
            the row alone and the outbox + Celery publish a Django user writes instead; reads p99;
  recovery  bench_recovery.py: abnormal recovery and verify MB/s of commitlog checked (CRC on);
  spark     bench_spark.py: the Spark source's scan into DataFrames.
Then it writes `summary.md` / `summary.json` in the run directory (each path: ours, the peer, the
ratio, the goal, met or not, and the bound beside it) and puts the table into benchmarks/README.md
between the `<!-- bench-summary -->` markers. Progress goes to stderr. Only loopback is used.

`--runs N` (`make bench` passes 2): the whole sequence N times back to back, each run in its own directory
with its own summary; the README then gets one table with every run's value and ratio side by side and a
goal counted met only when it is met in every run. On this shared 2-vCPU host several rows moved by
0.2-0.3x between two runs of the same code (benchmarks/README.md), so one run's verdict on a row near its
goal says little; two runs show that spread in the table itself.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.benchlib import echo_round_trips  # noqa: E402

BENCH = ROOT / "benchmarks"
STEPS = ("bounds", "store", "sweep", "broker", "pop", "celery", "django", "recovery", "spark")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- bounds ---------------------------------------------------------------------------------------------
def measure_bounds(var: Path) -> dict[str, Any]:
    out: dict[str, Any] = {}
    buf = os.urandom(64 << 20)
    dst = bytearray(len(buf))
    dst[:] = buf  # touch every page first: the copy below is memory bandwidth, not page faults
    t0 = time.perf_counter()
    for _ in range(4):
        dst[:] = buf
    out["memcpy_gb_s"] = round(4 * len(buf) / (time.perf_counter() - t0) / 1e9, 2)
    t0 = time.perf_counter()
    for _ in range(4):
        zlib.crc32(buf)
    out["crc32_gb_s"] = round(4 * len(buf) / (time.perf_counter() - t0) / 1e9, 2)
    var.mkdir(parents=True, exist_ok=True)
    fd, path = tempfile.mkstemp(dir=var)
    try:
        chunk = buf[: 4 << 20]
        t0 = time.perf_counter()
        for _ in range(64):  # 256 MiB
            os.write(fd, chunk)
        os.fdatasync(fd)
        out["disk_write_mb_s"] = round((256 << 20) / (time.perf_counter() - t0) / 1e6, 1)
        page = buf[:4096]
        t0 = time.perf_counter()
        for _ in range(300):
            os.write(fd, page)
            os.fdatasync(fd)
        out["fdatasync_per_s"] = round(300 / (time.perf_counter() - t0))
    finally:
        os.close(fd)
        os.unlink(path)
    out["python_echo_round_trips_per_s"] = echo_round_trips()
    return out


# -- running the benchmarks ------------------------------------------------------------------------------
def commands(quick: bool, run_dir: Path) -> dict[str, tuple[list[str], float]]:
    py = sys.executable
    q = ["--quick"] if quick else []
    out = ["--out", str(run_dir)]
    recovery = ["--big-gib", "1.1", "--small-mib", "16", "--reps", "2"] if quick else []
    return {
        "store": ([py, str(BENCH / "bench_store.py"), *q, *out], 2400),
        "sweep": ([py, str(BENCH / "bench_sweep.py"), *q, *out], 900),
        "broker": ([py, str(BENCH / "bench_broker.py"), *q, "--no-rabbit", *out], 1200),
        "pop": ([py, str(BENCH / "bench_pop.py"), *q, *out], 900),
        "celery": ([py, str(BENCH / "bench_celery.py"), *q, "--only", "apply", "--no-rabbit", *out], 900),
        "django": ([py, str(BENCH / "bench_django.py"), *q, *out], 900),
        "recovery": ([py, str(BENCH / "bench_recovery.py"), *recovery, *out], 1800),
        "spark": ([py, str(BENCH / "bench_spark.py"), *q, "--no-pushdown", "--out", str(run_dir)], 1800),
    }


def newest(run_dir: Path, prefix: str) -> dict[str, Any] | None:
    files = sorted(run_dir.glob(f"{prefix}-*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(files[-1].read_text()) if files else None


# -- the table ---------------------------------------------------------------------------------------------
def _fmt(v: float | None, unit: str = "") -> str:
    if v is None:
        return "–"
    if v >= 100:
        return f"{v:,.0f}{unit}"
    return f"{v:,.2f}{unit}" if v < 10 else f"{v:,.1f}{unit}"


def rows(run_dir: Path) -> list[dict[str, Any]]:
    """One row per goal of issue 16, from the run's files (a missing file leaves its rows unmeasured)."""
    out: list[dict[str, Any]] = []
    bounds = json.loads((run_dir / "bounds.json").read_text()) if (run_dir / "bounds.json").exists() else {}

    def row(path: str, ours: float | None, peer: str, peer_v: float | None, goal: str, goal_ratio: float | None,
            bound: str = "", unit: str = "msgs/s", ratio: float | None = None, met: bool | None = None) -> None:
        if ratio is None and ours is not None and peer_v:
            ratio = ours / peer_v
        if met is None and ratio is not None and goal_ratio is not None:
            met = ratio >= goal_ratio
        out.append({"path": path, "ours": ours, "unit": unit, "peer": peer, "peer_value": peer_v,
                    "ratio": None if ratio is None else round(ratio, 2), "goal": goal, "met": met, "bound": bound})

    st = newest(run_dir, "store")
    if st and "throughput" in st:
        v = st["throughput"]["variants"]
        rt = st["throughput"]["ratios"]
        raw = v.get("raw framing ceiling (b5)", {}).get("rate", {}).get("median")
        for b in (1000, 100):
            k = f"store put_messages x{b}"
            row(f"embedded put + dispatch, batches of {b}", v[k]["rate"]["median"], "bare Python framing loop", raw,
                "≥ 1.0×" if b == 1000 else "(≥ 1.0× at 1000)", 1.0 if b == 1000 else None,
                ratio=rt[f"{k} / raw framing ceiling (b5)"]["median_of_rounds"],
                bound=f"sustained (once the page cache is full): disk write {bounds.get('disk_write_mb_s', '?')} "
                      f"MB/s ≈ {_fmt(bounds.get('disk_write_mb_s', 0) * 1e6 / max(st.get('record_size') or 363, 1))}"
                      " records/s")
        single = v["store put_message"]["rate"]["median"]
        rs = rt["store put_message / raw framing ceiling (b5)"]["median_of_rounds"]
        row("embedded put + dispatch, single calls", single, "bare Python framing loop", raw,
            "≥ 150 k/s and ≥ 0.3×", None, ratio=rs, met=single >= 150_000 and rs >= 0.3)
    if st and "memory" in st:
        m = st["memory"]
        row(f"RSS heap growth while {m['n']:,} messages are appended", m["rss_anon_growth_mib_after_warmup"], "", None,
            "flat", None, unit="MiB", met=m["rss_anon_growth_mib_after_warmup"] < 16,
            bound=f"heap {m['rss_anon_mib_start']} → max {m['rss_anon_mib_max']} MiB")
        if "pull" in m:
            p = m["pull"]
            row(f"RSS heap growth while {p['n']:,} messages are pulled", p["rss_anon_growth_mib"], "", None, "flat",
                None, unit="MiB", met=p["rss_anon_growth_mib"] < 16,
                bound=f"heap {p['rss_anon_mib_start']} → max {p['rss_anon_mib_max']} MiB")
    br = newest(run_dir, "broker")
    if br:
        ours, redis = br["results"].get("ours", {}), br["results"].get("redis", {})
        # the echo timed in bench_broker's own rounds (older runs: the bounds step's, minutes earlier)
        echo = br.get("echo_round_trips_per_s") or bounds.get("python_echo_round_trips_per_s")
        for key, name, peer, goal, g in (
                ("send_single", "broker send, one client, single", "Redis XADD single", "≥ 1.0×", 1.0),
                ("send_batch", "broker send, one client, batched", "Redis XADD pipelined", "≥ 1.5×", 1.5),
                ("read_x32", "broker pull of 32", "Redis XRANGE 32", "≥ 1.0×", 1.0),
                ("read_x256", "broker pull of 256", "Redis XRANGE 256", "≥ 1.0×", 1.0)):
            if key in ours:
                bound = ""
                if key == "send_single" and echo:
                    shares = [f"ours {100 * ours[key]['median'] / echo:.0f}% of it"]
                    if key in redis:
                        shares.append(f"{peer} {100 * redis[key]['median'] / echo:.0f}%")
                    bound = f"Python echo round trip {_fmt(echo)}/s ({', '.join(shares)})"
                row(name, ours[key]["median"], peer, redis.get(key, {}).get("median"), goal, g, bound=bound)
    pop = newest(run_dir, "pop")
    if pop:
        redis = pop.get("peers", {}).get("redis", {})
        # the echo timed in bench_pop's own rounds (older runs: the bounds step's, minutes earlier)
        echo = pop.get("echo_round_trips_per_s") or bounds.get("python_echo_round_trips_per_s")
        for b in ("1", "32"):
            if b in pop["ours"]:
                ours = pop["ours"][b]["rate"]
                # a waited pop and a waited ack: two round trips a batch, none faster than the bare Python echo's
                floor = echo / 2 * int(b) if echo else None
                bound = (f"two Python echo round trips a batch: {_fmt(floor)} msgs/s (ours {100 * ours / floor:.0f}% "
                         "of it)" if floor else "")
                row(f"POP + ACK, batch {b}", ours, "Redis XREADGROUP + XACK", redis.get(b, {}).get("rate"), "≥ 1.5×",
                    1.5, bound=bound)
    ce = newest(run_dir, "celery")
    if ce and ce.get("summary", {}).get("apply_per_s"):
        a = ce["summary"]["apply_per_s"]
        bound = ce["summary"].get("apply_bound_per_s")
        row("Celery apply_async, one producer", a.get("ours"), "Celery on Redis", a.get("redis"), "≥ 1.5×", 1.5,
            ratio=ce["summary"].get("ratios", {}).get("ours/redis", {}).get("apply"), unit="tasks/s",
            bound=f"Celery on kombu's memory:// (no broker) {_fmt(bound)}/s" if bound else "")
    dj = newest(run_dir, "django")
    if dj:
        req = dj["requests"]
        ev, only = req.get("row+event", {}), req.get("row", {})
        if ev and only:
            row("Django request: row + event in one transaction", ev["req_per_s"], "the row alone",
                only["req_per_s"], "cost ≤ 1.3× the row alone", None, unit="req/s",
                ratio=1 / ev["cost_vs_row_only"], met=ev["cost_vs_row_only"] <= 1.3,
                bound=(f"cost {ev['cost_vs_row_only']:.2f}× the row alone; the outbox + Celery publish (Redis) "
                       f"costs {1 / ev['vs_outbox']:.2f}× ours" if ev.get("vs_outbox") else "")
                + (f"; with the marker insert left out (unsafe: this design's floor) the cost is "
                   f"{req['row+event-nomarker']['cost_vs_row_only']:.2f}×" if "row+event-nomarker" in req else ""))
        reads = dj.get("reads", {})
        if reads:
            p99 = max(r["p99_ms"] for r in reads.values())
            row("Django QuerySet reads through the broker, worst p99", p99, "", None, "p99 ≤ 1 ms", None, unit="ms",
                met=p99 <= 1.0, bound="; ".join(f"{k.split(' (')[0]} p50 {r['p50_ms']:.2f} / p99 {r['p99_ms']:.2f} ms"
                                               for k, r in reads.items()))
    rec = newest(run_dir, "recovery")
    if rec:
        crc = f"CRC32 {bounds.get('crc32_gb_s', '?')} GB/s, memcpy {bounds.get('memcpy_gb_s', '?')} GB/s"
        if "abnormal_big" in rec:
            a = rec["abnormal_big"]
            row("abnormal recovery (tail checked, CRC on)", a["mb_per_s"], "RocketMQ's reput parse",
                a.get("reput_parse_mb_per_s"), "≥ 1,000 MB/s", None, unit="MB/s", met=a["mb_per_s"] >= 1000,
                bound=crc)
        for k, val in rec.items():
            if k.startswith("verify") and isinstance(val, dict) and "mb_per_s" in val:
                row(f"verify ({k})", val["mb_per_s"], "", None, "≥ 1,000 MB/s", None, unit="MB/s",
                    met=val["mb_per_s"] >= 1000, bound=crc)
    sp = newest(run_dir, "spark")
    if sp:
        by = {r["name"]: r for r in sp["results"]}
        dec = by.get("python C decoder") or by.get("python numpy decoder")
        for cores in (1, 2):
            r = by.get(f"spark local[{cores}] full scan, C decoder") or by.get(f"spark local[{cores}] full scan, numpy decoder")
            if r:
                row(f"Spark scan into DataFrames, local[{cores}]", r["mb_per_s_per_core"], "", None,
                    "≥ 250 MB/s per core", None, unit="MB/s/core", met=r["mb_per_s_per_core"] >= 250,
                    bound=f"decode alone {_fmt(dec['mb_per_s'])} MB/s" if dec else "")
        for cores in (1, 2):  # the JVM reader (format("rocketmq-jvm")), when its jar was built
            r = by.get(f"spark local[{cores}] full scan, JVM reader (rocketmq-jvm)")
            py = by.get(f"spark local[{cores}] full scan, C decoder")
            if r:
                row(f"Spark scan into DataFrames, JVM reader (`rocketmq-jvm`), local[{cores}]", r["mb_per_s_per_core"],
                    f"`rocketmq` (Python source), local[{cores}]", py["mb_per_s_per_core"] if py else None,
                    "≥ 250 MB/s per core", None, unit="MB/s/core", met=r["mb_per_s_per_core"] >= 250)
    return out


def markdown(run_dir: Path, table: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    lines = [f"Run `{run_dir.relative_to(ROOT) if run_dir.is_relative_to(ROOT) else run_dir}` "
             f"({meta.get('started', '?')}, {'quick' if meta.get('quick') else 'full'}; load average "
             f"{meta.get('load_before', '?')} before, {meta.get('load_after', '?')} after; "
             f"{os.cpu_count()} vCPUs). Ratio = ours ÷ peer in the same run (the broker and POP rows: "
             "median of the rounds).", "",
             "| path | ours | peer | peer's value | ratio | goal | met | bound on this machine |",
             "|---|---:|---|---:|---:|---|---|---|"]
    for r in table:
        met = {True: "**yes**", False: "**no**", None: "–"}[r["met"]]
        ratio = "–" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        lines.append(f"| {r['path']} | {_fmt(r['ours'])} {r['unit']} | {r['peer'] or '–'} | {_fmt(r['peer_value'])} | "
                     f"{ratio} | {r['goal']} | {met} | {r['bound'] or '–'} |")
    if meta.get("bounds"):
        lines += ["", f"Bounds measured in this run: {_bounds_text(meta['bounds'])}"]
    if _failed(meta):
        lines += ["", "Steps that failed or timed out (their rows are missing): " + ", ".join(_failed(meta)) + "."]
    return "\n".join(lines) + "\n"


def _bounds_text(b: dict[str, Any]) -> str:
    return (f"memcpy {b.get('memcpy_gb_s')} GB/s, CRC32 {b.get('crc32_gb_s')} GB/s, sequential write + fdatasync "
            f"{b.get('disk_write_mb_s')} MB/s, {b.get('fdatasync_per_s')} fdatasyncs/s (4 KiB appends), Python loopback "
            f"echo {b.get('python_echo_round_trips_per_s')} round trips/s.")


def _failed(meta: dict[str, Any]) -> list[str]:
    return [k for k, v in meta.get("steps", {}).items() if v.get("rc") not in (0, None)]


def _cell(r: dict[str, Any] | None) -> str:
    if r is None:
        return "–"
    ratio = "" if r["ratio"] is None else f" ({r['ratio']:.2f}×)"
    return f"{_fmt(r['ours'])} {r['unit']}{ratio}"


def combined_markdown(run_dirs: list[Path], tables: list[list[dict[str, Any]]], metas: list[dict[str, Any]]) -> str:
    """One table over several runs of the same code: each row's value (and ratio) in every run, met when met in
    all of them; the peer and the bound are the last run's that has the row."""
    names = [d.relative_to(ROOT) if d.is_relative_to(ROOT) else d for d in run_dirs]
    lines = [f"{len(run_dirs)} runs (`make bench` makes them back to back): " + "; ".join(
                 f"`{n}` ({m.get('started', '?')}, {'quick' if m.get('quick') else 'full'}, load average "
                 f"{m.get('load_before', '?')} → {m.get('load_after', '?')})" for n, m in zip(names, metas, strict=True))
             + f"; {os.cpu_count()} vCPUs. Each run cell: ours (ratio = ours ÷ peer in that run; the broker and POP "
             "rows: median of its rounds). Met: in how many runs the goal was met.", "",
             "| path | goal | " + " | ".join(f"run {i + 1}" for i in range(len(run_dirs))) + " | met | peer (last run) | bound (last run) |",
             "|---|---|" + "---:|" * len(run_dirs) + "---|---|---|"]
    order: list[str] = []
    for t in tables:
        order += [r["path"] for r in t if r["path"] not in order]
    for path in order:
        cells = [next((r for r in t if r["path"] == path), None) for t in tables]
        last = next(r for r in reversed(cells) if r is not None)
        mets = [c["met"] for c in cells if c is not None and c["met"] is not None]
        if not mets:
            met = "–"
        else:
            k = sum(mets)
            met = f"**yes** ({k} of {len(mets)})" if k == len(mets) else (
                f"**no** (0 of {len(mets)})" if k == 0 else f"**{k} of {len(mets)}**")
        peer = f"{last['peer']} {_fmt(last['peer_value'])}" if last["peer"] else "–"
        lines.append(f"| {path} | {last['goal']} | " + " | ".join(_cell(c) for c in cells)
                     + f" | {met} | {peer} | {last['bound'] or '–'} |")
    for n, m in zip(names, metas, strict=True):
        if m.get("bounds"):
            lines += ["", f"Bounds in `{n}`: {_bounds_text(m['bounds'])}"]
        if _failed(m):
            lines += ["", f"Steps of `{n}` that failed or timed out (their cells are empty): " + ", ".join(_failed(m)) + "."]
    return "\n".join(lines) + "\n"


def _write_readme(md: str, sweep: Path | None) -> None:
    if sweep is not None and sweep.exists():  # the README shows the latest run's sweep
        (BENCH / "results" / "sweep.png").write_bytes(sweep.read_bytes())
    path = BENCH / "README.md"
    text = path.read_text()
    start, end = "<!-- bench-summary:start -->", "<!-- bench-summary:end -->"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        _, tail = rest.split(end, 1)
        path.write_text(f"{head}{start}\n{md}{end}{tail}")


def summarize_runs(run_dirs: list[Path], readme: bool) -> str:
    """`summarize` of each run (its own summary files), then the combined table (`combined.md` / `.json` in the
    last run's directory) into the README."""
    tables, metas = [], []
    for d in run_dirs:
        table, meta, _ = _summary(d)
        tables.append(table)
        metas.append(meta)
    md = combined_markdown(run_dirs, tables, metas)
    last = run_dirs[-1]
    (last / "combined.md").write_text(md)
    (last / "combined.json").write_text(json.dumps({"runs": [str(d) for d in run_dirs], "metas": metas,
                                                    "rows": tables}, indent=1))
    if readme:
        _write_readme(md, last / "sweep.png")
    return md


def summarize(run_dir: Path, readme: bool) -> str:
    """The run's table (`summary.md` / `.json` in its directory), and into the README with `readme`."""
    _, _, md = _summary(run_dir)
    if readme:
        _write_readme(md, run_dir / "sweep.png")
    return md


def _summary(run_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any], str]:
    """The run's rows, its meta (with the bounds) and its table; writes `summary.md` / `.json` beside them."""
    meta_path = run_dir / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    if (run_dir / "bounds.json").exists():
        meta["bounds"] = json.loads((run_dir / "bounds.json").read_text())
    table = rows(run_dir)
    md = markdown(run_dir, table, meta)
    (run_dir / "summary.json").write_text(json.dumps({"meta": meta, "rows": table}, indent=1))
    (run_dir / "summary.md").write_text(md)
    return table, meta, md


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="every benchmark's --quick (about 5 min instead of ~10)")
    ap.add_argument("--skip", action="append", default=[], choices=STEPS)
    ap.add_argument("--no-readme", action="store_true", help="do not write the table into benchmarks/README.md")
    ap.add_argument("--runs", type=int, default=1, help="the whole sequence this many times back to back, one "
                    "table over all of them (make bench: 2)")
    ap.add_argument("--summarize", metavar="DIR", nargs="+",
                    help="only rebuild the summary of earlier run directories (several: the combined table)")
    args = ap.parse_args(argv)
    if args.runs < 1:
        ap.error("--runs must be at least 1")
    if args.summarize:
        dirs = [Path(d).resolve() for d in args.summarize]
        print(report(dirs, not args.no_readme))
        return 0
    dirs, ok = [], True
    for n in range(args.runs):
        if args.runs > 1:
            log(f"== run {n + 1} of {args.runs}")
        run_dir, rc = run_once(args.quick, args.skip)
        dirs.append(run_dir)
        ok = ok and rc == 0
    print(report(dirs, not args.no_readme))
    return 0 if ok else 1


def report(dirs: list[Path], readme: bool) -> str:
    """The table of one run (`summarize`) or of several side by side (`summarize_runs`)."""
    return summarize(dirs[0], readme) if len(dirs) == 1 else summarize_runs(dirs, readme)


def run_once(quick: bool, skip: list[str]) -> tuple[Path, int]:
    """Every step once into a new run directory; (that directory, 0 when every step succeeded)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d-%H%M")
    run_dir = BENCH / "results" / f"run-{stamp}{'-quick' if quick else ''}"
    k = 1
    while run_dir.exists():  # two short runs within one minute: a directory each
        k += 1
        run_dir = BENCH / "results" / f"run-{stamp}{'-quick' if quick else ''}-{k}"
    run_dir.mkdir(parents=True)
    meta: dict[str, Any] = {"started": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
                            "quick": quick, "load_before": [round(x, 1) for x in os.getloadavg()], "steps": {}}
    todo = [s for s in STEPS if s not in skip]
    cmds = commands(quick, run_dir)
    for i, step in enumerate(todo, 1):
        t0 = time.perf_counter()
        log(f"[{i}/{len(todo)}] {step} ...")
        if step == "bounds":
            (run_dir / "bounds.json").write_text(json.dumps(measure_bounds(ROOT / "var" / "bench"), indent=1))
            rc = 0
        else:
            cmd, limit = cmds[step]
            with open(run_dir / f"{step}.log", "w") as logf:
                try:
                    rc = subprocess.run(cmd, cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, timeout=limit).returncode
                except subprocess.TimeoutExpired:
                    rc = "timeout"
        meta["steps"][step] = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
        status = "ok" if rc == 0 else f"FAILED ({rc}), see {run_dir / (step + '.log')}"
        log(f"[{i}/{len(todo)}] {step}: {status} in {time.perf_counter() - t0:.0f} s")
        meta["load_after"] = [round(x, 1) for x in os.getloadavg()]
        (run_dir / "run.json").write_text(json.dumps(meta, indent=1))
    return run_dir, 0 if all(v["rc"] == 0 for v in meta["steps"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
