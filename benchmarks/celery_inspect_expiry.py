"""`make expirytest`: N remote-control pings against a running Celery worker leave no reply queue behind.

A local broker (temporary store) and a `celery worker -P solo` process are started; then N times, each with a
fresh `Control` whose mailbox has a new id (so a new reply queue, as N separate `celery inspect ping` commands
would have; `--app-control`: `app.control.inspect()` in a loop, as one process would),
`inspect(limit=1).ping()` is called. Afterwards the broker's topics are counted: reply queue
topics left (must be 0), all kombu topics, consume queue directories, lines of the topic deletion log, the
bindings log's length and how many records a new connection replays (snapshots). Prints counts and times.

    python benchmarks/celery_inspect_expiry.py --pings 10000
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
APP = """\
import rmq_eventstore.kombu  # noqa: F401
from celery import Celery

app = Celery("pingapp", broker="rocketmq://{store}")
app.conf.broker_connection_retry_on_startup = True
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pings", type=int, default=10_000)
    ap.add_argument("--dir", default=None, help="work directory (default: a temporary one)")
    ap.add_argument("--app-control", action="store_true",
                    help="call app.control.inspect() in a loop, as one process would (kombu names the reply queue "
                         "after the bound mailbox object, so names recur as addresses are reused); default: a new "
                         "reply queue per call, as N separate `celery inspect ping` commands")
    args = ap.parse_args()
    work = Path(args.dir or tempfile.mkdtemp(prefix="expirytest-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    (work / "pingapp.py").write_text(APP.format(store=store))
    sys.path[:0] = [str(ROOT), str(work)]
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{work}")
    from celery.app.control import Control
    from pingapp import app

    from rmq_eventstore.client import Admin, ensure_local_broker, stop_local_broker
    from rmq_eventstore.kombu.names import QUEUE_PREFIX

    if not args.app_control:
        # kombu names a mailbox (its reply queue and the replies' routing key) after the process, thread and
        # object; give every mailbox its own id, as N separate `celery inspect ping` processes would have
        import kombu.pidbox

        kombu.pidbox.oid_from = lambda inst, threads=True: inst.__dict__.setdefault("_bench_oid", str(uuid.uuid4()))
    namesrv = ensure_local_broker(store, idle_exit=None).namesrv_addr
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "pingapp", "worker", "-P", "solo",
                               "--without-mingle", "--without-gossip", "-l", "warning", "-n", "w1@%h"],
                              cwd=work, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not app.control.inspect(timeout=2, limit=1).ping():
            if time.monotonic() > deadline or worker.poll() is not None:
                raise SystemExit("the worker does not answer: " + (worker.stderr.read().decode()
                                                                  if worker.poll() is not None else ""))
        answered = 0
        t0 = time.perf_counter()
        for i in range(args.pings):
            control = app.control if args.app_control else Control(app)
            r = control.inspect(timeout=5, limit=1).ping()
            answered += bool(r)
            if (i + 1) % 1000 == 0:
                print(f"{i + 1} pings, {time.perf_counter() - t0:.1f} s", flush=True)
        elapsed = time.perf_counter() - t0
        with Admin(namesrv) as admin:
            all_topics = admin.topic_list()
            groups = admin.consumer_groups() if hasattr(admin, "consumer_groups") else {}
        kombu_topics = [t for t in all_topics if QUEUE_PREFIX in t]
        replies = [t for t in kombu_topics if "_Preply_Pcelery_Ppidbox" in t]
        cq_dirs = len(os.listdir(store / "consumequeue"))
        deletions = store / "config" / "topicDeletions.log"
        del_lines = len(deletions.read_text().splitlines()) if deletions.exists() else 0
        with app.connection_for_write() as conn:
            shared = conn.default_channel.clients.shared
            shared.refresh()
            log_len, replayed = shared._offset, shared.replayed
        print(f"pings: {args.pings}, answered: {answered}, {elapsed:.1f} s ({1000 * elapsed / args.pings:.1f} ms "
              f"per ping)")
        used = {line.split('"')[3] for line in deletions.read_text().splitlines()} if deletions.exists() else set()
        print(f"reply queues used (deleted topics): {len(used)}; reply queue topics left: {len(replies)}")
        print(f"kombu topics: {len(kombu_topics)} {sorted(kombu_topics)}; all topics: {len(all_topics)}; "
              f"consume queue directories: {cq_dirs}")
        print(f"topic deletion log lines: {del_lines}; bindings log records: {log_len}; "
              f"replayed by a new connection: {replayed}; subscription groups: {len(groups)}")
        return 0 if not replies and answered == args.pings else 1
    finally:
        worker.terminate()
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
        stop_local_broker(store)
        if args.dir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
