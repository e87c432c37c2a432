"""The `eventsourcing` library's own performance tests on four persistence modules, in ONE run:

    python benchmarks/bench_eventsourcing.py [--rounds 3] [--no-postgres]

* ``eventsourcing.sqlite`` (a file database under var/bench/),
* ``eventsourcing.postgres`` (the local PostgreSQL on 127.0.0.1:5432, user postgres, trust auth; a
  database ``es_bench_<pid>`` is created and dropped),
* ``rmq_eventstore.eventsourcing`` embedded (the broker on a thread of this process, ROCKETMQ_EMBEDDED),
* ``rmq_eventstore.eventsourcing`` through a broker process that owns the store (``file://``, found through
  its broker.json), client and broker on separate GILs.

For each, the library's test methods are run as they are (`eventsourcing.tests.persistence`), each on a new
recorder of a new application, and the figures they print are parsed: `test_performance` of the aggregate,
application and process recorders ("µs per insert": 100 single-event inserts, one after the other),
`test_concurrent_throughput` ("Rate": 4 threads, 10 inserts of 50 events) and the wall time of
`test_concurrent_no_conflicts` (10 threads, 100 inserts of 100 events, 2 readers polling) and of
`NonInterleavingNotificationIDsBaseCase` (two threads racing 1,000-event inserts). Each figure is the median
of `--rounds` rounds. Prints a markdown table; `--json FILE` also writes the raw figures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
import unittest
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from eventsourcing.persistence import InfrastructureFactory  # noqa: E402
from eventsourcing.tests.persistence import (  # noqa: E402
    AggregateRecorderTestCase,
    ApplicationRecorderTestCase,
    NonInterleavingNotificationIDsBaseCase,
    ProcessRecorderTestCase,
)
from eventsourcing.utils import Environment  # noqa: E402

from rmq_eventstore.client import ensure_local_broker, stop_local_broker  # noqa: E402

SMALL = {"mapped_file_size_commit_log": 64 << 20, "mapped_file_size_consume_queue": 6_000_000,
         "max_hash_slot_num": 500_000, "max_index_num": 2_000_000}
PG = {"POSTGRES_HOST": "127.0.0.1", "POSTGRES_PORT": "5432", "POSTGRES_USER": "postgres", "POSTGRES_PASSWORD": ""}
_US = re.compile(r"([0-9.]+) μs per insert")
_RATE = re.compile(r"Rate: ([0-9.]+) inserts per second")


@contextlib.contextmanager
def backends(work: str, postgres: bool) -> Iterator[dict[str, dict[str, str]]]:
    """name -> the environment of a factory (the application name is added per test)."""
    out: dict[str, dict[str, str]] = {
        "SQLite (file)": {"PERSISTENCE_MODULE": "eventsourcing.sqlite",
                          "SQLITE_DBNAME": os.path.join(work, "sqlite.db"), "CREATE_TABLE": "y"},
    }
    dbname = f"es_bench_{os.getpid()}"
    if postgres:
        import psycopg

        with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as c:
            c.execute(f"CREATE DATABASE {dbname}")
        out["PostgreSQL 15"] = {"PERSISTENCE_MODULE": "eventsourcing.postgres", "POSTGRES_DBNAME": dbname,
                                "CREATE_TABLE": "y", **PG}
    opts = json.dumps(SMALL)
    out["rmq_eventstore embedded"] = {"PERSISTENCE_MODULE": "rmq_eventstore.eventsourcing",
                                      "ROCKETMQ_URL": "file://" + os.path.join(work, "embedded"),
                                      "ROCKETMQ_EMBEDDED": "y", "ROCKETMQ_BROKER_OPTIONS": opts}
    proc_store = os.path.join(work, "process")
    ensure_local_broker(proc_store, broker_options={**SMALL, "file_reserved_time": 87600,
                                                    "clean_file_forcibly_enable": False},
                        idle_exit=None, timeout=60)
    out["rmq_eventstore broker process"] = {"PERSISTENCE_MODULE": "rmq_eventstore.eventsourcing",
                                            "ROCKETMQ_URL": "file://" + proc_store}
    # keep one embedded factory open for the whole run, so the embedded broker is opened once
    keep = InfrastructureFactory.construct(Environment("Keep", out["rmq_eventstore embedded"]))
    try:
        yield out
    finally:
        keep.close()
        stop_local_broker(proc_store)
        if postgres:
            import psycopg

            with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres", autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def case(base: type, env: dict[str, str], kind: str, factories: list[Any]) -> type:
    def create_recorder(self: Any) -> Any:
        name = f"B{uuid.uuid4().hex[:10]}"
        own = dict(env)
        if "SQLITE_DBNAME" in own:  # a database file per recorder (its tracking table is not per application)
            own["SQLITE_DBNAME"] = f"{own['SQLITE_DBNAME']}.{name}"
        f = InfrastructureFactory.construct(Environment(name, own))
        factories.append(f)
        if kind == "aggregate":
            return f.aggregate_recorder("snapshots")
        if kind == "process":
            return f.process_recorder()
        return f.application_recorder()

    return type(f"Bench{base.__name__}", (base,), {"create_recorder": create_recorder})


def run_one(cls: type, method: str) -> tuple[str, float]:
    """Run one library test method; (what it printed, wall seconds). A failure aborts the benchmark."""
    buf = io.StringIO()
    suite = unittest.TestSuite([cls(method)])
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(buf):
        result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(suite)
    wall = time.perf_counter() - t0
    if not result.wasSuccessful():
        problems = result.failures + result.errors
        raise SystemExit(f"{cls.__name__}.{method} failed:\n{problems[0][1]}")
    return buf.getvalue(), wall


MEASURES: list[tuple[str, type, str, str, Callable[[str, float], float]]] = [
    ("aggregate insert µs", AggregateRecorderTestCase, "aggregate", "test_performance",
     lambda out, wall: float(_US.search(out).group(1))),  # type: ignore[union-attr]
    ("application insert µs", ApplicationRecorderTestCase, "application", "test_performance",
     lambda out, wall: float(_US.search(out).group(1))),  # type: ignore[union-attr]
    ("process insert µs", ProcessRecorderTestCase, "process", "test_performance",
     lambda out, wall: float(_US.search(out).group(1))),  # type: ignore[union-attr]
    ("concurrent throughput events/s", ApplicationRecorderTestCase, "application", "test_concurrent_throughput",
     lambda out, wall: float(_RATE.search(out).group(1))),  # type: ignore[union-attr]
    ("concurrent no conflicts s (10k events)", ApplicationRecorderTestCase, "application",
     "test_concurrent_no_conflicts", lambda out, wall: wall),
    ("non-interleaving s (2 x 1000)", NonInterleavingNotificationIDsBaseCase, "application", "test",
     lambda out, wall: wall),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-postgres", action="store_true")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    base = ROOT / "var" / "bench"
    base.mkdir(parents=True, exist_ok=True)
    work = tempfile.mkdtemp(prefix="es-", dir=base)
    figures: dict[str, dict[str, list[float]]] = {}
    started = time.time()
    try:
        with backends(work, not args.no_postgres) as envs:
            for _round in range(args.rounds):
                for name, env in envs.items():
                    factories: list[Any] = []
                    for label, tc, kind, method, parse in MEASURES:
                        out, wall = run_one(case(tc, env, kind, factories), method)
                        figures.setdefault(label, {}).setdefault(name, []).append(parse(out, wall))
                    for f in factories:
                        f.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    names = list(next(iter(figures.values())).keys())
    lines = [f"| figure (median of {args.rounds}) | " + " | ".join(names) + " |",
             "|---|" + "---:|" * len(names)]
    for label, per in figures.items():
        cells = []
        for n in names:
            v = statistics.median(per[n])
            cells.append(f"{v:,.0f}" if v >= 100 else f"{v:.2f}")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    print(f"\n({time.time() - started:.0f} s; load average {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs)")
    if args.json:
        args.json.write_text(json.dumps({"figures": figures, "markdown": table, "started": started}, indent=1))


if __name__ == "__main__":
    main()
