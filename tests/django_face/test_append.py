"""Appends: plain, batched, conditional (409), and bound to database transactions, with real processes
killed between the database commit and the end of the half message."""

from __future__ import annotations

import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request

import pytest
from django.db import IntegrityError, connection, transaction

from rmq_eventstore.django.exceptions import ConcurrencyError
from rmq_eventstore.django.marker import EventTransaction
from rmq_eventstore.django.transactions import transaction_producer, watcher
from tests.django_face.testapp.models import Order, OrderEvent, OrderLine

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def wait_for(predicate, timeout=15.0, interval=0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def test_plain_append_and_batch(event_store):
    e = OrderEvent.objects.append({"a": 1}, keys=["k1", "k2"], tags="Placed", properties={"source": "web"})
    got = OrderEvent.objects.get(pk=e.msg_id)
    assert got.data == {"a": 1} and got.keys == "k1 k2" and got.properties == {"source": "web"}
    assert (got.queue_id, got.queue_offset, got.commit_log_offset) == (e.queue_id, e.queue_offset, e.commit_log_offset)
    batch = OrderEvent.objects.bulk_append([{"i": i} for i in range(5)], stream="s-1", expected_version=0)
    assert [b.version for b in batch] == [1, 2, 3, 4, 5]
    assert len({b.queue_id for b in batch}) == 1
    assert [b.queue_offset for b in batch] == list(range(batch[0].queue_offset, batch[0].queue_offset + 5))
    assert [x.data["i"] for x in OrderEvent.objects.filter(stream="s-1").order_by("version")] == list(range(5))
    mixed = OrderEvent.objects.bulk_append([{"data": 1, "keys": "x"}, {"data": 2, "tags": "Paid"}])
    assert [m.keys for m in mixed] == ["x", ""] and [m.tags for m in mixed] == [None, "Paid"]


def test_expected_version_conflict(event_store):
    OrderEvent.objects.append({"v": 1}, stream="acct-1", expected_version=0)
    with pytest.raises(ConcurrencyError) as info:
        OrderEvent.objects.append({"v": 2}, stream="acct-1", expected_version=0)
    assert (info.value.stream, info.value.expected_version, info.value.current_version) == ("acct-1", 0, 1)
    assert info.value.status_code == 409
    assert OrderEvent.objects.filter(stream="acct-1").count() == 1
    assert OrderEvent.objects.append({"v": 2}, stream="acct-1", expected_version=1).version == 2


@pytest.mark.django_db(transaction=True)
def test_conflict_is_http_409(event_store, client):
    r = client.post("/streams/acct-9/", json.dumps({"data": 1, "expected": 0}), content_type="application/json")
    assert r.status_code == 201 and r.json()["version"] == 1
    r = client.post("/streams/acct-9/", json.dumps({"data": 2, "expected": 0}), content_type="application/json",
                    headers={"Accept": "application/json"})
    assert r.status_code == 409
    assert r.json() == {"error": "conflict", "detail": r.json()["detail"], "stream": "acct-9", "expected_version": 0,
                        "current_version": 1}


@pytest.mark.django_db(transaction=True)
def test_commit_makes_the_event_visible_with_the_row(event_store):
    with transaction.atomic():
        Order.objects.create(number="A-1")
        e = OrderEvent.objects.append({"number": "A-1"}, keys="A-1", stream="order-A-1", expected_version=0)
        assert EventTransaction.objects.filter(pk=e.msg_id, outcome=EventTransaction.COMMIT).exists()
        assert not OrderEvent.objects.filter(keys="A-1").exists()  # a half message: invisible until commit
    got = wait_for(lambda: OrderEvent.objects.filter(keys="A-1").first())
    assert got is not None and got.msg_id == e.msg_id and got.version == 1
    assert wait_for(lambda: not EventTransaction.objects.filter(pk=e.msg_id).exists(), 10)  # marker cleaned
    assert OrderEvent.objects.append({"n": 2}, stream="order-A-1", expected_version=1).version == 2


@pytest.mark.django_db(transaction=True)
def test_the_marker_row_holds_what_the_model_says(event_store):
    """The marker is inserted with one statement (`EventTransaction.insert`), not through the ORM: the row
    reads back through the model as the ORM would have written it (created_at now, in the database's time
    zone handling, outcome COMMIT), on SQLite and PostgreSQL alike; a second insert of the key conflicts."""
    from django.utils import timezone

    before = timezone.now()
    with transaction.atomic():
        e = OrderEvent.objects.append({"number": "M-1"}, keys="M-1")
        row = EventTransaction.objects.get(pk=e.msg_id)
        assert (row.store_alias, row.topic, row.outcome) == (event_store.alias, OrderEvent.topic,
                                                              EventTransaction.COMMIT)
        assert before - datetime.timedelta(seconds=1) <= row.created_at <= timezone.now()
        assert timezone.is_aware(row.created_at)
        with pytest.raises(IntegrityError), transaction.atomic():
            EventTransaction.insert("default", e.msg_id, event_store.alias, OrderEvent.topic, "R")
    assert wait_for(lambda: OrderEvent.objects.filter(keys="M-1").first()) is not None


@pytest.mark.django_db(transaction=True)
def test_on_postgresql_a_marker_inside_an_open_transaction_is_inserted_through_libpq(event_store, monkeypatch):
    """On PostgreSQL (psycopg 3) a marker inserted once the server has the transaction open goes through the
    session's libpq connection (`_insert_on_pgconn`), not Django's cursor: the same row, an IntegrityError
    for a key that is there (the transaction goes on after its savepoint), gone with a rolled-back block.
    A first statement of a transaction (it needs the BEGIN) and a connection whose queries are logged take
    the cursor; on SQLite every insert does."""
    from django.test.utils import CaptureQueriesContext
    from django.utils import timezone

    from rmq_eventstore.django import marker

    taken = []
    real = marker._insert_on_pgconn

    def spy(conn, sql, values):
        try:
            taken.append(real(conn, sql, values))
        except IntegrityError:
            taken.append("conflict")  # raised from the libpq path
            raise
        return taken[-1]

    monkeypatch.setattr(marker, "_insert_on_pgconn", spy)
    before = timezone.now()
    with transaction.atomic():
        OrderEvent.objects.append({"number": "L-0"}, keys="L-0")  # the transaction's first statement
        Order.objects.create(number="L-1")
        e = OrderEvent.objects.append({"number": "L-1"}, keys="L-1")
        row = EventTransaction.objects.get(pk=e.msg_id)
        assert (row.store_alias, row.topic, row.outcome) == (event_store.alias, OrderEvent.topic,
                                                              EventTransaction.COMMIT)
        assert before - datetime.timedelta(seconds=1) <= row.created_at <= timezone.now()
        with pytest.raises(IntegrityError), transaction.atomic():
            EventTransaction.insert("default", e.msg_id, event_store.alias, OrderEvent.topic, "R")
        Order.objects.create(number="L-2")  # the transaction is usable after the savepoint's rollback
    on_pg = connection.vendor == "postgresql"
    assert taken == ([False, True, "conflict"] if on_pg else [False, False, False])
    assert wait_for(lambda: OrderEvent.objects.filter(keys="L-1").first()) is not None
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(number="L-3")
        gone = OrderEvent.objects.append({"number": "L-3"}, keys="L-3")
        raise RuntimeError("the block fails")
    assert taken[-1] is on_pg
    assert not EventTransaction.objects.filter(pk=gone.msg_id).exists()
    with CaptureQueriesContext(connection) as queries, transaction.atomic():
        Order.objects.create(number="L-4")
        OrderEvent.objects.append({"number": "L-4"}, keys="L-4")
    assert taken[-1] is False
    assert any(EventTransaction._meta.db_table in q["sql"] for q in queries.captured_queries)
    assert not wait_for(lambda: OrderEvent.objects.filter(keys="L-3").exists(), 1.5)


@pytest.mark.django_db(transaction=True)
def test_marker_cleanup_asks_the_broker_once_per_topic(event_store, monkeypatch):
    """The watcher deletes the markers of committed events after one QUERY_TRANSACTION_ENDS per topic (the
    broker remembers the ends it made), not one QUERY_MESSAGE per transaction."""
    looked_up: list[str] = []
    monkeypatch.setattr(type(watcher), "_visible",
                        staticmethod(lambda store, topic, txid: looked_up.append(txid) or False))
    asked: list[str] = []
    admin_class = type(event_store.admin)
    real = admin_class.transaction_ends

    def spy(self, topic, ids):
        asked.extend(ids)
        return real(self, topic, ids)

    monkeypatch.setattr(admin_class, "transaction_ends", spy)
    events = []
    for i in range(3):
        with transaction.atomic():
            Order.objects.create(number=f"C-{i}")
            events.append(OrderEvent.objects.append({"i": i}, keys=f"C-{i}"))
    ids = {e.msg_id for e in events}
    assert wait_for(lambda: all(OrderEvent.objects.filter(keys=f"C-{i}").exists() for i in range(3)))
    watcher.clean_markers()
    assert not EventTransaction.objects.filter(pk__in=ids).exists()
    assert ids <= set(asked) and not ids & set(looked_up)


@pytest.mark.django_db(transaction=True)
def test_exception_in_block_never_appears_and_frees_the_stream(event_store):
    with pytest.raises(RuntimeError), transaction.atomic():
        Order.objects.create(number="B-1")
        e = OrderEvent.objects.append({"number": "B-1"}, keys="B-1", stream="order-B-1", expected_version=0)
        raise RuntimeError("the view failed")
    assert not Order.objects.filter(number="B-1").exists()
    # the watcher sees the discarded on_commit and rolls the half message back: the stream is free at once
    start = time.monotonic()
    version = wait_for(lambda: _try_append("order-B-1", 0), 10)
    assert version == 1 and time.monotonic() - start < 5
    time.sleep(1.5)  # past the broker's check-back time as well
    assert not OrderEvent.objects.filter(keys="B-1").exists()
    assert not OrderEvent.objects.filter(msg_id=e.msg_id).exists()


def _try_append(stream: str, expected: int) -> int | None:
    try:
        return OrderEvent.objects.append({"retry": True}, stream=stream, expected_version=expected).version
    except ConcurrencyError:
        return None


@pytest.mark.django_db(transaction=True)
def test_failed_database_commit_never_appears(event_store):
    with pytest.raises(IntegrityError), transaction.atomic():
        order = Order.objects.create(number="C-1")
        OrderLine.objects.create(order_id=order.pk + 10_000, sku="dangling")  # checked at COMMIT (deferred)
        OrderEvent.objects.append({"number": "C-1"}, keys="C-1")
    assert not Order.objects.filter(number="C-1").exists()
    assert wait_for(lambda: watcher.pending_count() == 0, 10)
    time.sleep(1.5)
    assert not OrderEvent.objects.filter(keys="C-1").exists()


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollback_drops_only_its_events(event_store):
    with transaction.atomic():
        OrderEvent.objects.append({"outer": True}, keys="D-outer")
        with pytest.raises(ValueError), transaction.atomic():
            OrderEvent.objects.append({"inner": True}, keys="D-inner")
            raise ValueError
    assert wait_for(lambda: OrderEvent.objects.filter(keys="D-outer").exists())
    time.sleep(1.5)
    assert not OrderEvent.objects.filter(keys="D-inner").exists()


CHILD = textwrap.dedent("""
    import os, signal, sys
    import django
    django.setup()
    from django.db import transaction
    from tests.django_face.testapp.models import Order, OrderEvent
    number, when = sys.argv[1], sys.argv[2]
    with transaction.atomic():
        Order.objects.create(number=number)
        if when == "after-commit":  # runs before the append's own on_commit: dies between COMMIT and END
            transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        OrderEvent.objects.append({"number": number}, keys=number, stream="order-" + number, expected_version=0)
        print("appended", flush=True)
        if when == "before-commit":
            os.kill(os.getpid(), signal.SIGKILL)
    print("not killed", flush=True)
""")


def _run_child(event_store, number: str, when: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.django_face.settings",
               RMQ_TEST_STORE_URL=f"rmq://{event_store.namesrv}",
               RMQ_TEST_DB_NAME=connection.settings_dict["NAME"], PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-c", CHILD, number, when], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


@pytest.mark.django_db(transaction=True)
def test_process_killed_after_database_commit_event_appears_once(event_store):
    transaction_producer(event_store)  # this process is a live member of the producer group
    r = _run_child(event_store, "K-1", "after-commit")
    assert r.returncode == -signal.SIGKILL and "appended" in r.stdout, r.stderr
    assert Order.objects.filter(number="K-1").exists()
    got = wait_for(lambda: list(OrderEvent.objects.filter(keys="K-1")), 20)
    assert len(got) == 1 and got[0].version == 1
    time.sleep(2)  # further checks would have found it settled
    assert OrderEvent.objects.filter(keys="K-1").count() == 1


@pytest.mark.django_db(transaction=True)
def test_process_killed_before_database_commit_event_never_appears(event_store):
    transaction_producer(event_store)
    r = _run_child(event_store, "K-2", "before-commit")
    assert r.returncode == -signal.SIGKILL and "appended" in r.stdout, r.stderr
    assert not Order.objects.filter(number="K-2").exists()
    # the check-back finds no marker, records a rollback, and the stream is free again
    assert wait_for(lambda: _try_append("order-K-2", 0), 20) == 1
    assert EventTransaction.objects.filter(outcome=EventTransaction.ROLLBACK).count() <= 1
    assert [e.data for e in OrderEvent.objects.filter(stream="order-K-2")] == [{"retry": True}]


def _race_round(url: str, version: int, n: int = 16) -> list[int]:
    """`n` requests at once, each appending at `version`; their status codes."""
    codes: list[int] = []
    lock = threading.Lock()
    barrier = threading.Barrier(n)

    def post(i: int) -> None:
        req = urllib.request.Request(f"{url}/streams/race/", method="POST",
                                     data=json.dumps({"data": i, "expected": version}).encode(),
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        barrier.wait()
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                code = resp.status
        except urllib.error.HTTPError as e:
            code = e.code
        with lock:
            codes.append(code)

    threads = [threading.Thread(target=post, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return codes


@pytest.mark.django_db(transaction=True)
def test_sixteen_concurrent_requests_one_wins_per_round(event_store, live_server):
    rounds = int(os.environ.get("DJANGO_RACE_ROUNDS", "5"))
    for version in range(rounds):
        codes = _race_round(live_server.url, version)
        assert sorted(codes) == [201] + [409] * 15, codes
        wait_for(lambda v=version: OrderEvent.objects.filter(stream="race").count() == v + 1, 10)
    assert [e.version for e in OrderEvent.objects.filter(stream="race").order_by("version")] == list(range(1, rounds + 1))


@pytest.mark.django_db(transaction=True)
def test_several_events_of_one_stream_in_one_transaction(event_store):
    with transaction.atomic():
        Order.objects.create(number="E-1")
        a = OrderEvent.objects.append({"step": "placed"}, stream="order-E-1", expected_version=0)
        b = OrderEvent.objects.append({"step": "paid"}, stream="order-E-1", expected_version=1)
        c = OrderEvent.objects.bulk_append([{"step": "packed"}, {"step": "shipped"}], stream="order-E-1")
    assert (a.version, b.version, [x.version for x in c]) == (1, 2, [3, 4])
    got = wait_for(lambda: [e.data["step"] for e in OrderEvent.objects.filter(stream="order-E-1").order_by("version")]
                   if OrderEvent.objects.filter(stream="order-E-1").count() == 4 else None)
    assert got == ["placed", "paid", "packed", "shipped"]
    # another transaction (and a plain append) wait for the first to end; after it, they continue the stream
    with pytest.raises(RuntimeError), transaction.atomic():
        OrderEvent.objects.append({"step": "x"}, stream="order-E-1", expected_version=4)
        OrderEvent.objects.append({"step": "y"}, stream="order-E-1", expected_version=5)
        outside: list[BaseException | None] = []

        def append_elsewhere() -> None:  # another thread: its own connection, no transaction
            try:
                OrderEvent.objects.append({"step": "outside"}, stream="order-E-1")
                outside.append(None)
            except ConcurrencyError as e:
                outside.append(e)
            finally:
                connection.close()

        t = threading.Thread(target=append_elsewhere)
        t.start()
        t.join()
        assert isinstance(outside[0], ConcurrencyError) and "pending transaction" in str(outside[0])
        raise RuntimeError
    assert wait_for(lambda: _try_append("order-E-1", 4), 10) == 5


def test_in_testcase_transaction_commit_via_captured_callbacks(event_store, django_capture_on_commit_callbacks, db):
    """Under pytest-django's `db` (Django's TestCase) nothing commits; capturing on_commit callbacks with
    execute=True ends the half messages as a real commit would."""
    with django_capture_on_commit_callbacks(execute=True):
        e1 = OrderEvent.objects.append({"n": 1}, stream="tc-1", expected_version=0)
        e2 = OrderEvent.objects.append({"n": 2}, stream="tc-1", expected_version=1)
    assert (e1.version, e2.version) == (1, 2)
    assert wait_for(lambda: OrderEvent.objects.filter(stream="tc-1").count() == 2)


@pytest.mark.django_db(transaction=True)
def test_next_append_right_after_a_commit_is_not_a_conflict(event_store):
    """END_TRANSACTION is one-way: the next append to the stream may reach the broker before it; that is
    waited out, not reported as a conflict (20 rounds of commit-then-append at once)."""
    for v in range(0, 40, 2):
        with transaction.atomic():
            OrderEvent.objects.append({"v": v}, stream="tight", expected_version=v)
        assert OrderEvent.objects.append({"v": v + 1}, stream="tight", expected_version=v + 1).version == v + 2


@pytest.mark.django_db(transaction=True)
def test_failed_marker_insert_rolls_the_half_message_back_at_once(event_store, monkeypatch):
    """The half message travels while the marker row is inserted; when that insert fails, the half message
    (already stored) is rolled back at once. Here the marker's key is taken by a committed COMMIT marker, so
    a check-back would even answer COMMIT for it: only the prompt rollback keeps the event out."""
    producer = transaction_producer(event_store)
    taken = producer._ids.create()
    EventTransaction.objects.create(transaction_id=taken, store_alias=event_store.alias, topic=OrderEvent.topic,
                                    outcome=EventTransaction.COMMIT)
    class Taken(type(producer._ids)):  # the generator keeps its state in slots: no instance attribute to patch
        __slots__ = ()

        def create(self) -> str:
            return taken

    monkeypatch.setattr(producer, "_ids", Taken())
    with pytest.raises(IntegrityError), transaction.atomic():
        OrderEvent.objects.append({"number": "F-1"}, keys="F-1", stream="order-F-1", expected_version=0)
    monkeypatch.undo()
    assert wait_for(lambda: _try_append("order-F-1", 0), 10) == 1  # the stream was freed, not committed
    time.sleep(1.5)  # past the broker's check-back time as well
    assert not OrderEvent.objects.filter(keys="F-1").exists()
    assert [e.data for e in OrderEvent.objects.filter(stream="order-F-1")] == [{"retry": True}]
