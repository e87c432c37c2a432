"""The SQLAlchemy face: appends bound to a Session's transaction, on SQLite and PostgreSQL, with real child
processes SIGKILLed at each step (before the half message, between it and the database commit, between the
commit and END, while answering a check-back), against a broker with fast check-backs."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine, func, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rmq_eventstore.broker.server import serve_in_thread
from rmq_eventstore.client import ConcurrencyError as ClientConcurrencyError
from rmq_eventstore.sqlalchemy import (
    AsyncEventStore,
    ConcurrencyError,
    EventStore,
    EventTransaction,
    MarkerBase,
    NewEvent,
    marker_table,
)
from rmq_eventstore.sqlalchemy import transactions as sqla_transactions
from tests.sqla_support import TOPIC, Base, Order, OrderLine, make_async_engine, make_engine

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PG_ADMIN = "host=127.0.0.1 user=postgres dbname=postgres"
BROKER = {"transaction_timeout": 1000, "transaction_check_interval": 500,
          "mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
          "max_hash_slot_num": 4096, "max_index_num": 16384}


def wait_for(predicate: Callable[[], Any], timeout: float = 15.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    return predicate()


def uid() -> str:
    return uuid.uuid4().hex[:10]


# -- fixtures ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    running = serve_in_thread(tmp_path_factory.mktemp("sqla-store"), **BROKER)
    try:
        yield running
    finally:
        running.close()


def _postgres_url() -> Iterator[str]:
    psycopg = pytest.importorskip("psycopg")
    name = f"rmq_sqla_{uid()}"
    try:
        with psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3) as c:
            c.execute(f'CREATE DATABASE "{name}"')
    except psycopg.OperationalError as e:
        if os.environ.get("CI"):  # CI's machine runs PostgreSQL: its absence is a failure there
            raise
        pytest.skip(f"no PostgreSQL at 127.0.0.1:5432: {e}")
    try:
        yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    finally:
        with psycopg.connect(PG_ADMIN, autocommit=True) as c:
            c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('sqla-db') / 'app.sqlite3'}"
        gen = iter([url])
    else:
        gen = _postgres_url()
    url = next(gen)
    engine = make_engine(url)
    Base.metadata.create_all(engine)
    MarkerBase.metadata.create_all(engine)
    engine.dispose()
    yield url
    for _ in gen:  # drop the database
        pass


@pytest.fixture
def engine(db_url: str) -> Iterator[Any]:
    e = make_engine(db_url)
    yield e
    e.dispose()


@pytest.fixture
def make_store(broker: Any, engine: Any) -> Iterator[Callable[..., EventStore]]:
    made: list[EventStore] = []

    def make(group: str | None = None, **kw: Any) -> EventStore:
        s = EventStore(f"rmq://{broker.namesrv_address}", engine, producer_group=group or f"sqla_{uid()}",
                       cleanup_interval=0.2, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        s.close()


@pytest.fixture
def es(make_store: Callable[..., EventStore]) -> EventStore:
    return make_store()


def markers(engine: Any, txid: str | None = None) -> list[tuple[str, str]]:
    t = EventTransaction.__table__
    stmt = select(t.c.transaction_id, t.c.outcome)
    if txid is not None:
        stmt = stmt.where(t.c.transaction_id == txid)
    with engine.connect() as c:
        return [tuple(r) for r in c.execute(stmt)]


def try_append(es: EventStore | AsyncEventStore, stream: str, expected: int) -> int | None:
    try:
        if isinstance(es, AsyncEventStore):
            return asyncio.run(es.append(None, TOPIC, {"retry": True}, stream=stream, expected_version=expected)).version
        return es.append(None, TOPIC, {"retry": True}, stream=stream, expected_version=expected).version
    except ConcurrencyError:
        return None


def group_markers(engine: Any, group: str) -> int:
    t = EventTransaction.__table__
    with engine.connect() as c:
        return c.scalar(select(func.count()).select_from(t).where(t.c.producer_group == group))


def run_child(broker: Any, db_url: str, group: str, scenario: str, number: str, wait: bool = True) -> Any:
    args = [sys.executable, "-m", "tests.sqla_support", db_url, broker.namesrv_address, group, scenario, number]
    env = dict(os.environ, PYTHONPATH=ROOT)
    if not wait:
        return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def appended_id(stdout: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("appended "))


def order_exists(engine: Any, number: str) -> bool:
    with Session(engine) as s:
        return s.scalar(select(func.count()).select_from(Order).where(Order.number == number)) == 1


# -- plain appends and reads ------------------------------------------------------------------------------

def test_plain_append_batch_read_and_conflict(es: EventStore, db_url: str) -> None:
    s = f"plain-{uid()}"
    e = es.append(None, TOPIC, {"a": 1}, keys=["k1", f"k-{s}"], tags="Placed", properties={"source": "web"},
                  stream=s, expected_version=0)
    assert (e.version, e.pending) == (1, False)
    batch = es.bulk_append(None, TOPIC, [{"i": 1}, NewEvent({"i": 2}, tags="Paid"), NewEvent(body=b"raw")],
                           stream=s, expected_version=1)
    assert [b.version for b in batch] == [2, 3, 4]
    got = es.read_stream(TOPIC, s)
    assert [g.data for g in got] == [{"a": 1}, {"i": 1}, {"i": 2}, b"raw"]
    assert got[0].properties == {"source": "web"} and got[0].tags == "Placed" and set(got[0].keys) >= {"k1"}
    assert got[2].tags == "Paid" and got[0].stored_at is not None
    assert es.get(TOPIC, e.msg_id).data == {"a": 1}
    assert [x.msg_id for x in es.find(TOPIC, f"k-{s}")] == [e.msg_id]
    with pytest.raises(ConcurrencyError) as info:
        es.append(None, TOPIC, {"late": True}, stream=s, expected_version=1)
    assert isinstance(info.value, ClientConcurrencyError) and info.value.status_code == 409
    assert (info.value.stream, info.value.expected_version, info.value.current_version) == (s, 1, 4)


def test_marker_table_shapes_and_session_checks(es: EventStore, tmp_path: Path) -> None:
    from sqlalchemy import MetaData
    from sqlalchemy.orm import DeclarativeBase

    from rmq_eventstore.sqlalchemy import EventTransactionMixin

    md = MetaData()
    t = marker_table(md, "my_markers")
    assert marker_table(md, "my_markers") is t and set(t.c.keys()) == set(EventTransaction.__table__.c.keys())

    class MyBase(DeclarativeBase):
        pass

    class MyMarker(EventTransactionMixin, MyBase):
        __tablename__ = "app_event_markers"

    assert set(MyMarker.__table__.c.keys()) == set(t.c.keys())
    other = create_engine(f"sqlite:///{tmp_path / 'other.sqlite3'}")
    with Session(other) as session, pytest.raises(ValueError, match="check-back could not find"):
        es.append(session, TOPIC, {"wrong": "db"})
    with pytest.raises(TypeError):
        EventStore("rmq://127.0.0.1:1", object())  # type: ignore[arg-type]


# -- appends in a transaction -----------------------------------------------------------------------------

def test_commit_makes_the_event_visible_and_cleans_its_marker(es: EventStore, engine: Any) -> None:
    n = uid()
    with Session(engine) as session, session.begin():
        session.add(Order(number=n))
        e = es.append(session, TOPIC, {"number": n}, keys=n, stream=f"order-{n}", expected_version=0)
        assert e.pending and e.version == 1
        assert not es.find(TOPIC, n)  # a half message: invisible until the commit
    got = wait_for(lambda: es.find(TOPIC, n), 5)
    assert [g.msg_id for g in got] == [e.msg_id] and got[0].version == 1
    assert wait_for(lambda: not markers(engine, e.msg_id), 5)  # resolved and visible: the marker goes
    assert try_append(es, f"order-{n}", 1) == 2


def test_next_append_right_after_a_commit_does_not_conflict(es: EventStore, engine: Any) -> None:
    """END COMMIT is one-way: the next request on the stream can reach the broker first; it waits for the
    end instead of failing with a conflict against this process's own, already committed, transaction."""
    s = f"seq-{uid()}"
    for v in range(6):
        with Session(engine) as session, session.begin():
            assert es.append(session, TOPIC, {"v": v}, stream=s, expected_version=v).version == v + 1
    assert es.append(None, TOPIC, {"v": "plain"}, stream=s, expected_version=6).version == 7
    assert [e.version for e in es.read_stream(TOPIC, s)] == list(range(1, 8))


def test_rollback_never_visible_and_the_stream_is_free_at_once(es: EventStore, engine: Any) -> None:
    n = uid()
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        session.add(Order(number=n))
        e = es.append(session, TOPIC, {"number": n}, keys=n, stream=f"order-{n}", expected_version=0)
        raise RuntimeError("the handler failed")
    start = time.monotonic()
    assert wait_for(lambda: try_append(es, f"order-{n}", 0), 2, 0.01) == 1
    assert time.monotonic() - start < 0.9  # sooner than any check-back (transaction_timeout 1 s)
    # explicit rollback() too
    session = Session(engine)
    e2 = es.append(session, TOPIC, {"n": 2}, keys=n, stream=f"order2-{n}", expected_version=0)
    assert sqla_transactions.pending_count(session) == 1
    session.rollback()
    session.close()
    assert wait_for(lambda: try_append(es, f"order2-{n}", 0), 2, 0.01) == 1
    time.sleep(1.5)  # past the check-back time as well
    assert {x.msg_id for x in es.find(TOPIC, n)}.isdisjoint({e.msg_id, e2.msg_id})
    assert not order_exists(engine, n) and not markers(engine, e.msg_id)


def test_close_without_commit_rolls_back(es: EventStore, engine: Any) -> None:
    n = uid()
    session = Session(engine)
    e = es.append(session, TOPIC, {"n": n}, keys=n, stream=f"order-{n}", expected_version=0)
    session.close()  # no rollback event; the transaction ends
    assert wait_for(lambda: try_append(es, f"order-{n}", 0), 2, 0.01) == 1
    assert e.msg_id not in {x.msg_id for x in es.find(TOPIC, n)}


def test_savepoint_rollback_drops_only_its_events(es: EventStore, engine: Any) -> None:
    n = uid()
    with Session(engine) as session, session.begin():
        outer = es.append(session, TOPIC, {"outer": True}, keys=n, stream=f"sp-{n}", expected_version=0)
        with pytest.raises(ValueError), session.begin_nested():
            es.append(session, TOPIC, {"inner": True}, keys=n, stream=f"sp-{n}", expected_version=1)
            raise ValueError
        with session.begin_nested():  # a released savepoint commits with the transaction
            kept = es.append(session, TOPIC, {"kept": True}, keys=n, stream=f"sp-{n}", expected_version=1)
    assert kept.version == 2
    got = wait_for(lambda: len(es.read_stream(TOPIC, f"sp-{n}")) == 2 and es.read_stream(TOPIC, f"sp-{n}"), 5)
    assert [g.data for g in got] == [{"outer": True}, {"kept": True}] and got[0].msg_id == outer.msg_id
    time.sleep(1.5)
    assert [g.data for g in es.find(TOPIC, n)] == [{"outer": True}, {"kept": True}]


def test_savepoint_rollback_with_a_late_end_leaves_no_hole(es: EventStore, engine: Any) -> None:
    """The savepoint's END ROLLBACK is one-way: the next append of the stream in the transaction must not
    be numbered after the rolled-back reservation (a hole once it goes), nor fail."""
    producer = es.transaction_producer
    real_end = producer.end_transaction

    def slow_rollback(sent: Any, state: Any, error: Any = None) -> None:
        if state.name == "ROLLBACK":
            threading.Timer(0.3, real_end, (sent, state, error)).start()
        else:
            real_end(sent, state, error)

    producer.end_transaction = slow_rollback  # type: ignore[method-assign]
    s = f"sp-late-{uid()}"
    with Session(engine) as session, session.begin():
        es.append(session, TOPIC, {"i": 1}, stream=s)
        with pytest.raises(ValueError), session.begin_nested():
            es.bulk_append(session, TOPIC, [{"i": "x"}, {"i": "y"}], stream=s)
            raise ValueError
        start = time.monotonic()
        kept = es.append(session, TOPIC, {"i": 2}, stream=s)  # waits for the broker to release 2 and 3
        assert kept.version == 2 and time.monotonic() - start >= 0.2
    got = wait_for(lambda: len(es.read_stream(TOPIC, s)) == 2 and es.read_stream(TOPIC, s), 5)
    assert [(g.version, g.data) for g in got] == [(1, {"i": 1}), (2, {"i": 2})]


def test_decision_waits_for_an_open_transaction(es: EventStore, engine: Any) -> None:
    """The check-back's insert meets the open transaction's marker: UNKNOWN (asked again later); once the
    transaction committed: COMMIT; a transaction that rolled back: ROLLBACK, for every process asking."""
    n = uid()
    session = Session(engine)
    e = es.append(session, TOPIC, {"n": n}, keys=n)
    answers: list[Any] = []
    t = threading.Thread(target=lambda: answers.append(es.markers.decide(e.msg_id, TOPIC)))
    t.start()
    t.join(10)
    assert [a.name for a in answers] == ["UNKNOWN"]
    session.commit()
    session.close()
    assert es.markers.decide(e.msg_id, TOPIC).name == "COMMIT"
    assert es.markers.decide("never-" + uid(), TOPIC).name == "ROLLBACK"


def test_failed_database_commit_never_appears(es: EventStore, engine: Any) -> None:
    n = uid()
    with pytest.raises(IntegrityError), Session(engine) as session, session.begin():
        session.add(Order(number=n))
        session.add(OrderLine(order_id=10_000_000, sku="dangling"))  # deferred: fails at COMMIT
        session.flush()
        e = es.append(session, TOPIC, {"number": n}, keys=n, stream=f"order-{n}", expected_version=0)
    assert not order_exists(engine, n)
    # the settler decides by the marker insert (the commit failed: no certainty without it): ROLLBACK
    assert wait_for(lambda: try_append(es, f"order-{n}", 0), 5) == 1
    time.sleep(1.5)
    assert e.msg_id not in {x.msg_id for x in es.find(TOPIC, n)}
    assert wait_for(lambda: not markers(engine, e.msg_id), 5)


def test_several_events_of_one_stream_in_one_transaction(es: EventStore, engine: Any) -> None:
    n = uid()
    s = f"order-{n}"
    with Session(engine) as session, session.begin():
        a = es.append(session, TOPIC, {"step": "placed"}, stream=s, expected_version=0)
        b = es.append(session, TOPIC, {"step": "paid"}, stream=s, expected_version=1)
        c = es.bulk_append(session, TOPIC, [{"step": "packed"}, {"step": "shipped"}], stream=s)
        # another writer waits for this transaction: the stream is held, no hole if it rolled back
        with pytest.raises(ConcurrencyError, match="pending transaction"):
            es.append(None, TOPIC, {"step": "outside"}, stream=s)
    assert (a.version, b.version, [x.version for x in c]) == (1, 2, [3, 4])
    got = wait_for(lambda: len(es.read_stream(TOPIC, s)) == 4 and es.read_stream(TOPIC, s), 5)
    assert [g.data["step"] for g in got] == ["placed", "paid", "packed", "shipped"]
    with pytest.raises(RuntimeError), Session(engine) as session, session.begin():
        es.append(session, TOPIC, {"step": "x"}, stream=s, expected_version=4)
        es.append(session, TOPIC, {"step": "y"}, stream=s, expected_version=5)
        raise RuntimeError
    assert wait_for(lambda: try_append(es, s, 4), 2, 0.01) == 5


def test_conflict_in_a_transaction_leaves_it_usable(es: EventStore, engine: Any) -> None:
    n = uid()
    es.append(None, TOPIC, {"first": True}, stream=f"order-{n}", expected_version=0)
    with Session(engine) as session, session.begin():
        session.add(Order(number=n))
        with pytest.raises(ConcurrencyError):
            es.append(session, TOPIC, {"second": True}, stream=f"order-{n}", expected_version=0)
        ok = es.append(session, TOPIC, {"second": True}, stream=f"order-{n}", expected_version=1)
    assert order_exists(engine, n)
    got = wait_for(lambda: len(es.read_stream(TOPIC, f"order-{n}")) == 2 and es.read_stream(TOPIC, f"order-{n}"), 5)
    assert got[1].msg_id == ok.msg_id
    assert wait_for(lambda: not any(t == ok.msg_id for t, _ in markers(engine)), 5)


def test_concurrent_writers_at_one_version_exactly_one_wins(es: EventStore, engine: Any) -> None:
    s = f"race-{uid()}"
    writers = 8
    for version in range(3):
        results: list[str] = []
        lock = threading.Lock()
        barrier = threading.Barrier(writers)

        def write(i: int, version: int = version, barrier: threading.Barrier = barrier,
                  lock: threading.Lock = lock, results: list[str] = results) -> None:
            barrier.wait()
            try:
                with Session(engine) as session, session.begin():
                    es.append(session, TOPIC, {"writer": i}, stream=s, expected_version=version)
                outcome = "won"
            except ConcurrencyError:
                outcome = "conflict"
            with lock:
                results.append(outcome)

        threads = [threading.Thread(target=write, args=(i,)) for i in range(writers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(results) == ["conflict"] * (writers - 1) + ["won"], results
        assert wait_for(lambda v=version: len(es.read_stream(TOPIC, s)) == v + 1, 5)
    assert [e.version for e in es.read_stream(TOPIC, s)] == [1, 2, 3]


def test_sweep_deletes_old_resolved_markers(es: EventStore, engine: Any) -> None:
    old = datetime.now(UTC) - timedelta(hours=1)
    t = EventTransaction.__table__
    e = es.append(None, TOPIC, {"visible": True})
    rows = [("sweep-r-" + uid(), "R", TOPIC), (e.msg_id, "C", TOPIC), ("sweep-c-" + uid(), "C", TOPIC)]
    with engine.begin() as c:
        for txid, outcome, topic in rows:
            c.execute(insert(t).values(transaction_id=txid, producer_group=es.producer_group, topic=topic,
                                       outcome=outcome, created_at=old))
    assert es.sweep_markers(older_than=60) == 2
    left = {txid for txid, _ in markers(engine)}
    assert rows[0][0] not in left and rows[1][0] not in left and rows[2][0] in left  # never visible: kept


# -- processes killed at each step ------------------------------------------------------------------------

def test_killed_before_the_half_message(es: EventStore, engine: Any, broker: Any, db_url: str) -> None:
    n = uid()
    r = run_child(broker, db_url, es.producer_group, "before-half", n)
    assert r.returncode == -9 and "appended" not in r.stdout, r.stderr
    assert not order_exists(engine, n)
    assert try_append(es, f"order-{n}", 0) == 1  # nothing reserved the stream
    assert group_markers(engine, es.producer_group) == 0  # the marker went with the transaction


def test_killed_between_half_message_and_commit(es: EventStore, engine: Any, broker: Any, db_url: str) -> None:
    es.start()  # this process is a live member of the group: it answers the check-back
    n = uid()
    r = run_child(broker, db_url, es.producer_group, "before-commit", n)
    assert r.returncode == -9 and "appended" in r.stdout, r.stderr
    txid = appended_id(r.stdout)
    assert not order_exists(engine, n)
    # the check-back finds no committed marker, inserts a ROLLBACK one: the stream is free again
    assert wait_for(lambda: try_append(es, f"order-{n}", 0), 15, 0.1) == 1
    assert [e.data for e in es.read_stream(TOPIC, f"order-{n}")] == [{"retry": True}]
    assert txid not in {e.msg_id for e in es.find(TOPIC, n)}
    assert wait_for(lambda: not markers(engine, txid), 5)


def test_killed_between_commit_and_end_appears_once(es: EventStore, engine: Any, broker: Any,
                                                     db_url: str) -> None:
    es.start()
    n = uid()
    r = run_child(broker, db_url, es.producer_group, "after-commit", n)
    assert r.returncode == -9 and "committed" in r.stdout, r.stderr
    txid = appended_id(r.stdout)
    assert order_exists(engine, n) and markers(engine, txid) == [(txid, "C")]
    got = wait_for(lambda: es.find(TOPIC, n), 15, 0.1)
    assert [e.msg_id for e in got] == [txid] and got[0].version == 1
    time.sleep(1.5)  # further check-backs would find it settled
    assert len(es.find(TOPIC, n)) == 1
    assert wait_for(lambda: not markers(engine, txid), 5)  # cleaned by the process that answered


@pytest.mark.parametrize("original, member", [("after-commit", "member-die-after-decide"),
                                              ("before-commit", "member-die-in-decide-tx")])
def test_answering_member_killed_mid_check(make_store: Callable[..., EventStore], engine: Any, broker: Any,
                                           db_url: str, original: str, member: str) -> None:
    es = make_store()  # not a member yet: the first check-back must go to the child member
    n = uid()
    r = run_child(broker, db_url, es.producer_group, original, n)
    assert r.returncode == -9 and "appended" in r.stdout, r.stderr
    txid = appended_id(r.stdout)
    m = run_child(broker, db_url, es.producer_group, member, n, wait=False)
    out, err = m.communicate(timeout=30)
    said = "decided COMMIT" if member == "member-die-after-decide" else "dying in the decision's transaction"
    assert m.returncode == -9 and said in out, (out, err)
    es.start()  # another member answers the next check-back
    if original == "after-commit":
        got = wait_for(lambda: es.find(TOPIC, n), 15, 0.1)
        assert [e.msg_id for e in got] == [txid]
        time.sleep(1.5)
        assert len(es.find(TOPIC, n)) == 1
    else:
        assert wait_for(lambda: try_append(es, f"order-{n}", 0), 15, 0.1) == 1
        assert txid not in {e.msg_id for e in es.find(TOPIC, n)}
    assert wait_for(lambda: not markers(engine, txid), 5)


# -- the asyncio variant ----------------------------------------------------------------------------------

@pytest.fixture
def aes(broker: Any, db_url: str) -> Iterator[tuple[AsyncEventStore, Any]]:
    engine = make_async_engine(db_url)
    store = AsyncEventStore(f"rmq://{broker.namesrv_address}", engine, producer_group=f"sqla_async_{uid()}",
                            cleanup_interval=0.2)
    yield store, engine
    store.close()
    asyncio.run(engine.dispose())


def test_async_commit_rollback_and_failed_commit(aes: tuple[AsyncEventStore, Any], engine: Any) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    store, aengine = aes
    n = uid()

    async def scenario() -> tuple[str, str, str]:
        sessions = async_sessionmaker(aengine, expire_on_commit=False)
        async with sessions() as session, session.begin():
            session.add(Order(number=n))
            ok = await store.append(session, TOPIC, {"n": 1}, keys=n, stream=f"a-{n}", expected_version=0)
        try:
            async with sessions() as session, session.begin():
                rb = await store.append(session, TOPIC, {"n": 2}, keys=n, stream=f"a-{n}", expected_version=1)
                raise RuntimeError
        except RuntimeError:
            pass
        try:
            async with sessions() as session, session.begin():
                session.add(OrderLine(order_id=10_000_001, sku="dangling"))
                await session.flush()
                bad = await store.append(session, TOPIC, {"n": 3}, keys=n, stream=f"b-{n}", expected_version=0)
        except IntegrityError:
            pass
        got = []
        for _ in range(100):
            got = await store.read_stream(TOPIC, f"a-{n}")
            if got:
                break
            await asyncio.sleep(0.05)
        assert [g.msg_id for g in got] == [ok.msg_id]
        return ok.msg_id, rb.msg_id, bad.msg_id

    ok, rb, bad = asyncio.run(scenario())
    start = time.monotonic()
    assert wait_for(lambda: try_append(store, f"a-{n}", 1), 2, 0.01) == 2  # the rollback freed it at once
    assert time.monotonic() - start < 0.9
    assert wait_for(lambda: try_append(store, f"b-{n}", 0), 5) == 1  # the failed commit: decided ROLLBACK
    time.sleep(1.2)
    assert {e.msg_id for e in asyncio.run(store.find(TOPIC, n))} == {ok}
    assert wait_for(lambda: not [m for m in markers(engine) if m[0] in (ok, rb, bad)], 5)


def test_async_killed_between_commit_and_end(aes: tuple[AsyncEventStore, Any], engine: Any, broker: Any,
                                             db_url: str) -> None:
    store, _ = aes
    store.start()  # the check-back is answered through the store's own event loop
    n = uid()
    r = run_child(broker, db_url, store.producer_group, "async-after-commit", n)
    assert r.returncode == -9 and "committed" in r.stdout, r.stderr
    txid = appended_id(r.stdout)
    got = wait_for(lambda: asyncio.run(store.find(TOPIC, n)), 15, 0.1)
    assert [e.msg_id for e in got] == [txid]
    time.sleep(1.2)
    assert len(asyncio.run(store.find(TOPIC, n))) == 1
    assert wait_for(lambda: not markers(engine, txid), 5)


def test_marker_cleanup_asks_the_broker_once_per_topic(make_store: Callable[..., EventStore], engine: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The settler deletes the markers of committed events after one QUERY_TRANSACTION_ENDS per topic (the
    broker remembers the ends it made), not one QUERY_MESSAGE per transaction each cleanup round (a marker whose
    event is not visible yet was asked about again every round, for up to 10 minutes)."""
    es = make_store()
    looked_up: list[str] = []
    monkeypatch.setattr(es, "visible", lambda topic, txid: looked_up.append(txid) or False)
    asked: list[str] = []
    real = type(es.admin).transaction_ends

    def spy(self: Any, topic: str, ids: list[str]) -> Any:
        asked.extend(ids)
        return real(self, topic, ids)

    monkeypatch.setattr(type(es.admin), "transaction_ends", spy)
    events, keys = [], [uid() for _ in range(5)]
    for n in keys:
        with Session(engine) as session, session.begin():
            session.add(Order(number=n))
            events.append(es.append(session, TOPIC, {"number": n}, keys=n))
    ids = {e.msg_id for e in events}
    assert wait_for(lambda: all(es.find(TOPIC, n) for n in keys), 10)
    time.sleep(0.1)
    es.clean_markers()
    assert not any(markers(engine, txid) for txid in ids)
    assert ids <= set(asked) and not ids & set(looked_up)
