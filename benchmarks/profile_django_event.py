#!/usr/bin/env python3
"""Where a Django row + event request spends, against the row alone: instructions of the Django process per
request (valgrind cachegrind, deterministic) and CPU per request of the three processes (perf's task-clock
of the PostgreSQL backend and the broker, the Django process's own CPU time).

    python benchmarks/profile_django_event.py [row row+event ...] [--n 600] [--base 200] [--callgrind DIR]
    python benchmarks/profile_django_event.py --cpu [--n 2000] [--rounds 3]

The views, settings and store are bench_django.py's (PostgreSQL at 127.0.0.1:5432, user postgres; a local
store in shared mode, its broker a child process NOT under valgrind, started by this script). Default mode:
each kind's requests run in a child under `valgrind --tool=cachegrind --cache-sim=no`, once `--base` and once
`--n` requests after 30 warm-up ones; per request = the difference / (n - base), so start-up, migrations'
checks, warm-up and shut-down cancel out. The client's and the watcher's wall-clock periods (the idle reader's
50 ms, the sweep's 0.5 s, the cleanup's 5 s) are multiplied by `--time-scale` (50, about valgrind's slowdown)
so they come as often per request as at full speed: unscaled, the idle reader took the socket between two
requests and read most half messages' answers on its own thread (+150k instructions a request). `--callgrind DIR` also keeps a callgrind profile of each kind's
long run (`callgrind_annotate --inclusive=yes`). `--cpu`: no valgrind; the kinds take turns in this process,
`--n` requests a round, and each process's CPU per request is printed (noisy at the 10 µs level: other work
on the machine slows caches, not counts). A profiling tool: nothing is compared and nothing is asserted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "django_app"))

CHILD = r"""
import sys
sys.path.insert(0, sys.argv[1]); sys.path.insert(0, sys.argv[1] + "/django_app")
from pathlib import Path
import benchmarks.bench_django as bd
bd.DB_NAME = sys.argv[2]
bd.configure(Path(sys.argv[3]))
bd.urlpatterns = bd.urlpatterns_()
kind, n, tag, scale = sys.argv[4], int(sys.argv[5]), sys.argv[6], float(sys.argv[7])
# valgrind runs the process ~50x slower than the machine: the client's and the watcher's wall-clock periods are
# stretched as much, so that they fire per request as often as they would at full speed (else, e.g., the idle
# reader takes the socket between two requests and every half message's answer is read by another thread)
import rmq_eventstore.client.remoting_client as rc, rmq_eventstore.django.transactions as tx
rc.IDLE_READ_SECONDS *= scale
tx.WATCH_INTERVAL *= scale
tx.CLEANUP_INTERVAL *= scale
from django.test import Client
client = Client()
for i in range(30):
    assert client.post(f"/{kind}?n=w{tag}-{i}").status_code == 201
post = client.post
for i in range(n):
    assert post(f"/{kind}?n={tag}-{i}").status_code == 201
from rmq_eventstore.django.connection import stores
stores.close_all()
"""

_runs = iter(range(1 << 30))


def _instructions(out: Path) -> int:
    for line in out.read_text().splitlines():
        if line.startswith("summary:"):
            return int(line.split()[1])
    raise RuntimeError(f"no summary line in {out}")


def valgrind_run(db: str, store: Path, kind: str, n: int, root: Path, callgrind: Path | None = None,
                 scale: float = 50.0) -> int:
    """Total instructions of a Django process that served 30 + `n` requests of `kind`."""
    tag = f"cg{next(_runs)}-{kind}"
    out = Path(tempfile.mkdtemp(prefix="cg-django-", dir=root)) / "cachegrind.out"
    tool = (["--tool=callgrind", f"--callgrind-out-file={callgrind / ('callgrind.' + kind + '.out')}"] if callgrind
            else ["--tool=cachegrind", "--cache-sim=no", f"--cachegrind-out-file={out}"])
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONMALLOC="malloc")
    subprocess.run(["valgrind", *tool, sys.executable, "-c", CHILD, str(REPO), db, str(store), kind, str(n), tag,
                    str(scale)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO, env=env)
    return 0 if callgrind else _instructions(out)


class _PerfClock:
    """perf's task-clock (ns of CPU) of one process while the block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.ns = pid, 0.0

    def __enter__(self) -> _PerfClock:
        self.out = tempfile.NamedTemporaryFile("w+", suffix=".perf")  # noqa: SIM115
        self.proc = subprocess.Popen(["perf", "stat", "-x,", "-e", "task-clock", "-p", str(self.pid),
                                      "-o", self.out.name], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.3)
        return self

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(30)
        for line in Path(self.out.name).read_text().splitlines():
            parts = line.split(",")
            if len(parts) > 2 and parts[2] == "task-clock":
                self.ns = float(parts[0]) * 1e6  # msec
        self.out.close()


def cpu_rounds(kinds: list[str], n: int, rounds: int, store: Path) -> None:
    """The kinds in turn, `n` requests a round: CPU µs per request of Django (this process), PostgreSQL
    (the session's backend) and the broker."""
    from django.db import connection
    from django.test import Client

    from rmq_eventstore.common.broker_file import read_broker_file

    client = Client()
    for k in kinds:
        for i in range(30):
            assert client.post(f"/{k}?n=cpuw-{k}-{i}").status_code == 201
    with connection.cursor() as c:
        c.execute("select pg_backend_pid()")
        backend = c.fetchone()[0]
    broker = read_broker_file(store)["pid"]
    for r in range(rounds):
        for k in kinds:
            with _PerfClock(backend) as pg, _PerfClock(broker) as br:
                t0, w0 = time.process_time(), time.perf_counter()
                for i in range(n):
                    assert client.post(f"/{k}?n=cpu{r}-{k}-{i}").status_code == 201
                dj, wall = time.process_time() - t0, time.perf_counter() - w0
            print(f"round {r + 1} {k:14s} per request: wall {wall / n * 1e6:7.1f} µs  CPU django {dj / n * 1e6:7.1f}"
                  f"  postgres {pg.ns / n / 1e3:7.1f}  broker {br.ns / n / 1e3:7.1f} µs", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kinds", nargs="*", default=["row", "row+event"])
    ap.add_argument("--n", type=int, default=None, help="requests (valgrind: the long run, 600; --cpu: a round, 2000)")
    ap.add_argument("--base", type=int, default=200, help="requests of the short valgrind run")
    ap.add_argument("--callgrind", type=Path, default=None, help="also keep a callgrind profile per kind here")
    ap.add_argument("--cpu", action="store_true", help="CPU per request of the three processes, no valgrind")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--time-scale", type=float, default=50.0,
                    help="valgrind: the client's idle-read delay and the watcher's periods multiplied by this")
    args = ap.parse_args()
    import psycopg

    import benchmarks.bench_django as bd

    db = bd.DB_NAME = f"profile_django_{os.getpid()}"
    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {db}")
    root = Path(tempfile.mkdtemp(prefix="profile-django-"))
    store = root / "store"
    try:
        bd.configure(store)
        bd.urlpatterns = bd.urlpatterns_()
        from django.core.management import call_command
        from django.test import Client

        call_command("migrate", verbosity=0)
        assert Client().post("/row+event?n=start").status_code == 201  # starts the store's broker process
        if args.cpu:
            cpu_rounds(args.kinds, args.n or 2000, args.rounds, store)
        else:
            n = args.n or 600
            for kind in args.kinds:
                small = valgrind_run(db, store, kind, args.base, root, scale=args.time_scale)
                large = valgrind_run(db, store, kind, n, root, scale=args.time_scale)
                print(f"{kind:14s} {(large - small) / (n - args.base):12,.0f} instructions per request "
                      f"(Django process; {args.base} vs {n})", flush=True)
                if args.callgrind is not None:
                    args.callgrind.mkdir(parents=True, exist_ok=True)
                    valgrind_run(db, store, kind, n, root, args.callgrind, args.time_scale)
        from rmq_eventstore.django.connection import stores

        stores.close_all()
    finally:
        from django.db import connections

        from rmq_eventstore.client.local import stop_local_broker

        stop_local_broker(store)
        connections.close_all()
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {db} WITH (FORCE)")
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
