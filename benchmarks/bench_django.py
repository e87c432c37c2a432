"""The Django face under load, side by side with what a Django user would do instead, in one run.

1. A request that writes one row and appends one event (inside ``transaction.atomic()``: a half message,
   a marker row, the END on commit) on PostgreSQL, against
   (a) the same request writing the row only, and
   (b) the transactional outbox: the row, an outbox row, and a Celery publish on commit to the local Redis,
   and (c) row+event with the half message sent before the marker insert instead of during it
   (``row+event-seq``, the design before the overlap), to show what the overlap saves in the same run,
   and (d) row+event with the marker insert left out (``row+event-nomarker``: not a safe append, the floor of
   this design: what the half message, the END and the event's Python cost without the marker).
   Each request goes through Django's whole handler (``django.test.Client``: URL routing, middleware,
   the view, the transaction); the store is a local one, served by its own broker process (shared mode).
2. QuerySet reads through the broker: ``filter(keys=...)`` (index) and ``filter(stream=...)`` (a stream of
   8 events), p50 and p99.

Usage: ``python benchmarks/bench_django.py [--quick] [--requests N]``; writes benchmarks/results/django*.json and
a plot. Needs the local PostgreSQL and Redis (loopback only).
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

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "django_app"))

DB_NAME = f"bench_django_{os.getpid()}"


def configure(store: Path) -> None:
    import django
    from django.conf import settings

    settings.configure(
        DEBUG=False, USE_TZ=True, SECRET_KEY="bench", ROOT_URLCONF=__name__, ALLOWED_HOSTS=["*"],
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rmq_eventstore.django", "orders",
                        "benchmarks.bench_django_outbox"],
        MIDDLEWARE=["rmq_eventstore.django.exceptions.ConcurrencyErrorMiddleware"],
        DATABASES={"default": {"ENGINE": "django.db.backends.postgresql", "NAME": DB_NAME, "USER": "postgres",
                               "HOST": "127.0.0.1", "PORT": "5432", "CONN_MAX_AGE": None}},
        RMQ_EVENTSTORE={"default": {"URL": f"file://{store}", "OPTIONS": {"PRODUCER_GROUP": "bench"}}},
        DEFAULT_AUTO_FIELD="django.db.models.BigAutoField",
    )
    django.setup()


# -- the three views ----------------------------------------------------------------------------------------

def view_row_only(request):
    from django.db import transaction
    from django.http import HttpResponse
    from orders.models import Order

    with transaction.atomic():
        Order.objects.create(number=request.GET["n"], customer="bench", total_cents=100)
    return HttpResponse(status=201)


def view_row_and_event(request):
    from django.db import transaction
    from django.http import HttpResponse
    from orders.models import Order, OrderEvent

    n = request.GET["n"]
    with transaction.atomic():
        Order.objects.create(number=n, customer="bench", total_cents=100)
        OrderEvent.objects.append({"type": "OrderPlaced", "number": n}, keys=n, tags="Placed")
    return HttpResponse(status=201)


def view_row_and_event_sequential(request):
    """row+event with the marker inserted before the half message is sent (the design before the overlap)."""
    from rmq_eventstore.django import transactions

    transactions.OVERLAP_MARKER_INSERT = False
    try:
        return view_row_and_event(request)
    finally:
        transactions.OVERLAP_MARKER_INSERT = True


def view_row_and_event_without_marker(request):
    """row+event with the marker insert left out (`_MarkerInsert` does nothing): NOT a safe append (a check-back
    could not tell whether the transaction committed), only this design's floor, to show how much of the
    row+event cost the marker is and how much is the half message, the END and the event's Python."""
    from rmq_eventstore.django import transactions

    real = transactions._MarkerInsert.__call__

    def skip(self) -> None:  # type: ignore[no-untyped-def]
        self.done = True

    transactions._MarkerInsert.__call__ = skip
    try:
        return view_row_and_event(request)
    finally:
        transactions._MarkerInsert.__call__ = real


def view_row_and_outbox(request):
    import functools

    from django.db import transaction
    from django.http import HttpResponse
    from orders.models import Order

    from benchmarks.bench_django_outbox.models import Outbox

    n = request.GET["n"]
    with transaction.atomic():
        Order.objects.create(number=n, customer="bench", total_cents=100)
        row = Outbox.objects.create(topic="orders", payload={"type": "OrderPlaced", "number": n})
        transaction.on_commit(functools.partial(_publish, row.pk, n))
    return HttpResponse(status=201)


_celery = None


def _publish(pk: int, n: str) -> None:
    """The outbox's on-commit publish: a Celery task message to Redis, then the row marked sent."""
    from benchmarks.bench_django_outbox.models import Outbox

    _celery.send_task("orders.placed", args=[n])
    Outbox.objects.filter(pk=pk).update(sent=True)


def urlpatterns_():
    from django.urls import path

    return [path("row", view_row_only), path("row+event", view_row_and_event),
            path("row+event-seq", view_row_and_event_sequential), path("row+outbox", view_row_and_outbox),
            path("row+event-nomarker", view_row_and_event_without_marker)]


urlpatterns: list = []


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def run(requests: int, rounds: int) -> dict:
    from django.test import Client

    client = Client()
    out: dict = {}
    kinds = ["row", "row+event", "row+event-seq", "row+outbox", "row+event-nomarker"]
    for k in kinds:  # warm up: connections, the broker started, routes, Celery's producer pool
        for i in range(30):
            assert client.post(f"/{k}?n=w-{k}-{i}").status_code == 201
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):  # the kinds take turns request by request, so drifts of the machine hit them alike
        spent = dict.fromkeys(kinds, 0.0)
        for i in range(requests):
            for k in kinds:
                t = time.perf_counter()
                resp = client.post(f"/{k}?n={k}-{r}-{i}")
                took = time.perf_counter() - t
                samples[k].append(took)
                spent[k] += took
                assert resp.status_code == 201
        print(f"round {r + 1}/{rounds} " + "  ".join(f"{k} {requests / spent[k]:.0f} req/s" for k in kinds),
              flush=True)
    for k in kinds:
        xs = samples[k]
        out[k] = {"requests": len(xs), "req_per_s": len(xs) / sum(xs), "p50_ms": percentile(xs, 50) * 1000,
                  "p99_ms": percentile(xs, 99) * 1000, "mean_ms": statistics.fmean(xs) * 1000}
    base = out["row"]["mean_ms"]
    for k in kinds:
        out[k]["cost_vs_row_only"] = out[k]["mean_ms"] / base
    out["row+event"]["vs_outbox"] = out["row+event"]["mean_ms"] / out["row+outbox"]["mean_ms"]
    out["row+event"]["vs_sequential"] = out["row+event"]["mean_ms"] / out["row+event-seq"]["mean_ms"]
    return out


def reads(n: int) -> dict:
    from orders.models import OrderEvent

    for s in range(50):
        OrderEvent.objects.bulk_append([{"i": i} for i in range(8)], keys=f"key-{s}", stream=f"read-{s}")
    res = {}
    for name, fn in (("by key (filter(keys=...).first())", lambda i: OrderEvent.objects.filter(keys=f"key-{i % 50}").first()),
                     ("by stream (8 events, list)", lambda i: list(OrderEvent.objects.filter(stream=f"read-{i % 50}"))),
                     ("by msg_id (get(pk=...))", None)):
        if fn is None:
            ids = [e.msg_id for e in OrderEvent.objects.filter(stream="read-0")]
            fn = lambda i, ids=ids: OrderEvent.objects.get(pk=ids[i % len(ids)])  # noqa: E731
        for i in range(50):
            fn(i)
        xs = []
        for i in range(n):
            t = time.perf_counter()
            fn(i)
            xs.append(time.perf_counter() - t)
        res[name] = {"n": n, "p50_ms": percentile(xs, 50) * 1000, "p99_ms": percentile(xs, 99) * 1000}
        print(f"{name:36s} p50 {res[name]['p50_ms']:.3f} ms  p99 {res[name]['p99_ms']:.3f} ms", flush=True)
    return res


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    kinds = [k for k in ("row", "row+event", "row+event-seq", "row+outbox", "row+event-nomarker")
             if k in result["requests"]]
    req = result["requests"]
    colors = {"row": "#999", "row+event": "#2a7", "row+event-seq": "#8c8", "row+outbox": "#c63",
              "row+event-nomarker": "#ddd"}
    a.bar(kinds, [req[k]["mean_ms"] for k in kinds], color=[colors[k] for k in kinds])
    a.tick_params(axis="x", labelsize=7)
    a.set_ylabel("ms per request (mean)")
    a.set_title("A Django request on PostgreSQL")
    for i, k in enumerate(kinds):
        a.text(i, req[k]["mean_ms"], f"{req[k]['cost_vs_row_only']:.2f}×", ha="center", va="bottom")
    names = list(result["reads"])
    b.bar(range(len(names)), [result["reads"][n]["p50_ms"] for n in names], label="p50")
    b.bar(range(len(names)), [result["reads"][n]["p99_ms"] - result["reads"][n]["p50_ms"] for n in names],
          bottom=[result["reads"][n]["p50_ms"] for n in names], label="p99", alpha=0.5)
    b.set_xticks(range(len(names)), [n.split(" (")[0] for n in names])
    b.axhline(1.0, color="r", lw=0.8, ls="--")
    b.set_ylabel("ms")
    b.set_title("QuerySet reads through the broker")
    b.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer requests (a smoke run)")
    ap.add_argument("--requests", type=int, default=None, help="requests per round and kind (default 500, quick 100)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds (default 5, quick 2)")
    ap.add_argument("--out", default=str(HERE / "results"), help="directory for the JSON and the PNG")
    args = ap.parse_args()
    requests = args.requests or (100 if args.quick else 500)
    rounds = args.rounds or (2 if args.quick else 5)
    import psycopg

    with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
        c.execute(f"CREATE DATABASE {DB_NAME}")
    tmp = tempfile.mkdtemp(prefix="bench-django-")
    store = Path(tmp) / "store"
    try:
        configure(store)
        global urlpatterns, _celery
        urlpatterns = urlpatterns_()
        from celery import Celery
        from django.core.management import call_command

        _celery = Celery("bench", broker="redis://127.0.0.1:6379/15")
        call_command("migrate", verbosity=0)
        result = {"machine": os.uname().nodename, "cores": os.cpu_count(), "requests": run(requests, rounds),
                  "reads": reads(200 if args.quick else 2000)}
        from rmq_eventstore.django.connection import stores

        stores.close_all()
    finally:
        from rmq_eventstore.client.local import stop_local_broker

        stop_local_broker(store)
        from django.db import connections

        connections.close_all()
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {DB_NAME} WITH (FORCE)")
        shutil.rmtree(tmp, ignore_errors=True)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    out = out_dir / f"django-{time.strftime('%Y-%m-%d')}{'-quick' if args.quick else ''}.json"
    out.write_text(json.dumps(result, indent=2))
    plot(result, out_dir / "django.png")
    req = result["requests"]
    print(json.dumps({k: {m: round(v, 3) for m, v in req[k].items()} for k in req}, indent=1))
    print(f"row+event costs {req['row+event']['cost_vs_row_only']:.2f}x the row-only request "
          f"(goal <= 1.3) and {req['row+event']['vs_outbox']:.2f}x the outbox+Celery request (goal < 1); "
          f"{req['row+event']['vs_sequential']:.2f}x the sequential row+event; without the marker (unsafe, the "
          f"design's floor) the cost would be {req['row+event-nomarker']['cost_vs_row_only']:.2f}x")


if __name__ == "__main__":
    main()
