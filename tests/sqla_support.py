"""Models, engines and the child process of the SQLAlchemy face's tests (tests/test_sqlalchemy_face.py).

Run as ``python -m tests.sqla_support DB_URL NAMESRV GROUP SCENARIO NUMBER``: the child does one piece of
session work against the store and SIGKILLs itself at the step the scenario names (or, for the ``member-*``
scenarios, joins the producer group and dies while answering a check-back).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from typing import Any

from sqlalchemy import ForeignKey, String, create_engine, event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from rmq_eventstore.client import TransactionState
from rmq_eventstore.sqlalchemy import AsyncEventStore, EventStore

TOPIC = "SqlaOrders"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    number: Mapped[str] = mapped_column(String(40), unique=True)


class OrderLine(Base):
    __tablename__ = "order_lines"

    id: Mapped[int] = mapped_column(primary_key=True)
    # checked at COMMIT: a dangling line makes the database commit fail
    order_id: Mapped[int] = mapped_column(ForeignKey("orders.id", deferrable=True, initially="DEFERRED"))
    sku: Mapped[str] = mapped_column(String(40))


def _sqlite_setup(sync_engine: Engine) -> None:
    """SQLite as SQLAlchemy recommends for real transactions (BEGIN emitted by SQLAlchemy, so savepoints
    work), with foreign keys enforced."""

    @event.listens_for(sync_engine, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:
        dbapi_connection.isolation_level = None
        cur = dbapi_connection.cursor()
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA busy_timeout=15000")
        cur.close()

    @event.listens_for(sync_engine, "begin")
    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 15})
        _sqlite_setup(engine)
        return engine
    return create_engine(url, pool_size=20)


def make_async_engine(url: str) -> Any:
    from sqlalchemy.ext.asyncio import create_async_engine

    if url.startswith("sqlite"):
        engine = create_async_engine(url.replace("sqlite://", "sqlite+aiosqlite://", 1), connect_args={"timeout": 15})
        _sqlite_setup(engine.sync_engine)
        return engine
    return create_async_engine(url)


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _member(store: EventStore, how: str) -> None:
    """Join the group; die while answering the first check-back."""
    if how == "member-die-in-decide-tx":  # the ROLLBACK marker inserted, its transaction not committed
        @event.listens_for(store.engine, "commit")
        def on_commit(conn: Any) -> None:
            print("dying in the decision's transaction", flush=True)
            _die()
    else:  # decided, the answer not sent
        real = store.markers.decide

        def decide(txid: str, topic: str) -> TransactionState:
            state = real(txid, topic)
            print("decided", state.name, flush=True)
            _die()
            return state

        store.markers.decide = decide  # type: ignore[method-assign]
    store.start()
    print("member ready", flush=True)
    time.sleep(30)
    print("never asked", flush=True)


def main(argv: list[str]) -> None:
    db_url, namesrv, group, scenario, number = argv
    if scenario.startswith("async-"):
        asyncio.run(_async_main(db_url, namesrv, group, scenario[len("async-"):], number))
        return
    engine = make_engine(db_url)
    store = EventStore(f"rmq://{namesrv}", engine, producer_group=group)
    if scenario.startswith("member-"):
        _member(store, scenario)
        return
    producer = store.transaction_producer
    if scenario == "before-half":
        producer.prepare = lambda *a, **k: _die()  # type: ignore[method-assign]
    if scenario == "after-commit":  # the database committed; END COMMIT never leaves
        real_end = producer.end_transaction

        def end(sent: Any, state: TransactionState, error: Any = None) -> None:
            if state is TransactionState.COMMIT:
                print("committed", flush=True)
                _die()
            real_end(sent, state, error)

        producer.end_transaction = end  # type: ignore[method-assign]
    with Session(engine) as session, session.begin():
        session.add(Order(number=number))
        session.flush()
        e = store.append(session, TOPIC, {"number": number}, keys=number, stream=f"order-{number}",
                         expected_version=0)
        print("appended", e.msg_id, flush=True)
        if scenario == "before-commit":
            _die()
    print("not killed", flush=True)
    store.close()


async def _async_main(db_url: str, namesrv: str, group: str, scenario: str, number: str) -> None:
    from sqlalchemy.ext.asyncio import async_sessionmaker

    engine = make_async_engine(db_url)
    store = AsyncEventStore(f"rmq://{namesrv}", engine, producer_group=group)
    await store.start_async()
    if scenario == "after-commit":
        producer = store.transaction_producer
        real_end = producer.end_transaction

        def end(sent: Any, state: TransactionState, error: Any = None) -> None:
            if state is TransactionState.COMMIT:
                print("committed", flush=True)
                _die()
            real_end(sent, state, error)

        producer.end_transaction = end  # type: ignore[method-assign]
    sessions = async_sessionmaker(engine)
    async with sessions() as session, session.begin():
        session.add(Order(number=number))
        e = await store.append(session, TOPIC, {"number": number}, keys=number, stream=f"order-{number}",
                               expected_version=0)
        print("appended", e.msg_id, flush=True)
        if scenario == "before-commit":
            _die()
    print("not killed", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
