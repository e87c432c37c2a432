"""Appends bound to a SQLAlchemy `Session`'s transaction: a marker row plus a RocketMQ half message.

An append made with a session (1) inserts a marker row (``marker``) through that session, so in its
transaction, (2) stores the event as a half message (invisible; with a stream it reserves the version), and
(3) remembers the half message on the session. Then SQLAlchemy's session events end it:

* ``after_commit`` of the session's outermost transaction (the database committed): END COMMIT;
* ``after_soft_rollback`` of the transaction or of the savepoint the append was made in: END ROLLBACK at
  once (the marker went with it), so the stream is free again without waiting for a check-back. When the
  rollback follows a failed commit (``before_commit`` ran), whether the database committed is not certain
  (a connection lost during COMMIT), so the background settler decides by the marker insert instead;
* ``after_transaction_end`` of the outermost transaction with appends still open (``Session.close()``
  without a rollback event, say): the same as a rollback;
* the process dies first: the broker asks any live member of the producer group (the store's
  ``check_transaction``), which decides by the marker.

The decision (``MarkerStore.decide``) is one insert of a marker with outcome ROLLBACK in its own
transaction. While the original transaction is open its uncommitted marker holds the key (the insert waits
on PostgreSQL, and on SQLite for the database lock, 2 s at most): the answer is UNKNOWN and the broker asks
again. Otherwise either the original committed (the insert conflicts: COMMIT) or it never can (ROLLBACK;
its own marker insert is gone). Every process that asks gets the same answer.

Marker rows are deleted by the settler once resolved: a committed one when the event is visible in the
store (END_TRANSACTION is one-way, so the marker must outlive a lost END), a ROLLBACK one at the next
cleanup. ``sweep`` also removes old resolved markers that a process which died took with it.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, delete, event, insert, select, text
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, SessionTransaction

from ..client import TransactionSendResult, TransactionState
from .marker import COMMIT, ROLLBACK

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

    from .store import BaseEventStore

log = logging.getLogger(__name__)

STATE_KEY = "rmq_eventstore.sqlalchemy"
HOOKED_KEY = "rmq_eventstore.sqlalchemy.hooked"
PG_LOCK_TIMEOUT = "2s"  # how long a decision waits for an open transaction's marker
SQLITE_BUSY_MS = 2000


# -- the store's own statements on the marker table ---------------------------------------------------------

class MarkerStore:
    """Statements on the marker table in their own transactions: the decision and the cleanup. `run(fn)`
    calls ``fn(connection)`` inside a transaction and returns its result (`SyncRunner`, `AsyncRunner`)."""

    def __init__(self, table: Table, group: str, run: Callable[[Callable[[Connection], Any]], Any]) -> None:
        self.table = table
        self.group = group
        self.run = run

    def decide(self, txid: str, topic: str) -> TransactionState:
        """COMMIT if the transaction's marker is committed, ROLLBACK if it never can be, else UNKNOWN."""
        t = self.table

        def insert_rollback(conn: Connection) -> None:
            stmt = insert(t).values(transaction_id=txid, producer_group=self.group, topic=topic, outcome=ROLLBACK,
                                    created_at=datetime.now(UTC))
            if conn.dialect.name == "postgresql":
                conn.execute(text(f"SET LOCAL lock_timeout = '{PG_LOCK_TIMEOUT}'"))
            elif conn.dialect.name == "sqlite":  # wait as long as on PostgreSQL, not the connection's timeout
                before = conn.exec_driver_sql("PRAGMA busy_timeout").scalar()
                conn.exec_driver_sql(f"PRAGMA busy_timeout = {SQLITE_BUSY_MS}")
                try:
                    conn.execute(stmt)
                finally:
                    conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(before or 0)}")
                return
            conn.execute(stmt)

        try:
            self.run(insert_rollback)
            return TransactionState.ROLLBACK
        except IntegrityError:
            pass
        except SQLAlchemyError as e:  # locked / lock timeout: the original transaction is still open
            log.info("transaction %s is undecided for now (%s)", txid, type(e.orig or e).__name__)
            return TransactionState.UNKNOWN
        try:
            outcome = self.run(lambda c: c.execute(select(t.c.outcome).where(t.c.transaction_id == txid)).scalar())
        except SQLAlchemyError as e:
            log.info("marker of %s not readable (%s)", txid, e)
            return TransactionState.UNKNOWN
        if outcome is None:  # deleted between the two statements: resolved and cleaned, ask again
            return TransactionState.UNKNOWN
        return TransactionState.COMMIT if outcome == COMMIT else TransactionState.ROLLBACK

    def delete(self, txids: Sequence[str]) -> None:
        t = self.table
        self.run(lambda c: c.execute(delete(t).where(t.c.transaction_id.in_(list(txids)))))

    def older_than(self, cutoff: datetime, limit: int = 500) -> list[tuple[str, str, str]]:
        """(transaction id, topic, outcome) of this group's markers created before `cutoff`."""
        t = self.table
        stmt = (select(t.c.transaction_id, t.c.topic, t.c.outcome)
                .where(t.c.producer_group == self.group, t.c.created_at < cutoff).limit(limit))
        return self.run(lambda c: [tuple(r) for r in c.execute(stmt)])

    def outcome(self, txid: str) -> str | None:
        t = self.table
        return self.run(lambda c: c.execute(select(t.c.outcome).where(t.c.transaction_id == txid)).scalar())

    def close(self) -> None:
        closer = getattr(self.run, "close", None)
        if closer is not None:
            closer()


class SyncRunner:
    """`MarkerStore.run` on a sync `Engine` (thread-safe, its pool shared with the application)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __call__(self, fn: Callable[[Connection], Any]) -> Any:
        with self.engine.begin() as conn:
            return fn(conn)


class AsyncRunner:
    """`MarkerStore.run` for an `AsyncEngine`: check-backs and cleanup come from client threads, so the
    statements run on a private event loop thread, over an engine of its own (a `NullPool` copy of the
    application's engine unless one is given: an async pool must not be shared between event loops)."""

    def __init__(self, engine_factory: Callable[[], AsyncEngine]) -> None:
        self._factory = engine_factory
        self._engine: AsyncEngine | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=loop.run_forever, name="rmq-eventstore-sqla-loop",
                                                daemon=True)
                self._thread.start()
                self._loop = loop
            return self._loop

    def __call__(self, fn: Callable[[Connection], Any]) -> Any:
        async def go() -> Any:
            if self._engine is None:
                self._engine = self._factory()
            async with self._engine.begin() as conn:
                return await conn.run_sync(fn)

        return asyncio.run_coroutine_threadsafe(go(), self._ensure_loop()).result(60)

    def close(self) -> None:
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return
        engine, self._engine = self._engine, None
        if engine is not None:
            try:
                asyncio.run_coroutine_threadsafe(engine.dispose(), loop).result(10)
            except Exception:  # pragma: no cover - best effort
                log.exception("disposing the marker engine failed")
        loop.call_soon_threadsafe(loop.stop)
        if self._thread is not None:
            self._thread.join(5)
        loop.close()


# -- the session side -------------------------------------------------------------------------------------

@dataclass
class _Pending:
    store: BaseEventStore
    sent: TransactionSendResult
    topic: str
    stream: str | None
    owner: SessionTransaction  # the transaction or savepoint the append was made in
    done: bool = False


@dataclass
class _SessionState:
    """The appends of one outermost transaction of a session (``session.info[STATE_KEY]``)."""

    root: SessionTransaction
    group: str = field(default_factory=lambda: uuid.uuid4().hex)  # STREAM_TX_GROUP of its half messages
    pendings: list[_Pending] = field(default_factory=list)
    commit_attempted: bool = False
    # versions of a stream given up by a rolled-back savepoint: the tail of this group's reservations,
    # released by a one-way END the broker may not have handled when the next append of the stream comes
    rolled_back: dict[tuple[str, str], int] = field(default_factory=dict)

    def live(self) -> list[_Pending]:
        return [p for p in self.pendings if not p.done]

    def expected_after_rollback(self, topic: str, stream: str | None, expected: int | None) -> tuple[int | None, bool]:
        """The expected version to send for the next append of `stream`, and whether a conflict may be the
        broker not having handled a savepoint's END ROLLBACK yet (then the append is retried briefly).

        After a savepoint rolled back versions v.. of the stream, the next one of this transaction is v:
        sending ``expected = v - 1`` makes the broker refuse (rather than number it after the rolled-back
        reservations, leaving a hole) until it has released them."""
        if stream is None:
            return expected, False
        first = self.rolled_back.get((topic, stream))
        if first is None:
            return expected, False
        return (first - 1 if expected is None else expected), True


def _innermost(session: Session) -> SessionTransaction:
    tx = session.get_nested_transaction() or session.get_transaction()
    if tx is None:  # pragma: no cover - the marker insert began one
        raise RuntimeError("the session has no transaction")
    return tx


def begin_append(session: Session) -> _SessionState:
    """The session's state for its current transaction (call after the marker insert began it); hooks the
    session's events the first time."""
    if not session.info.get(HOOKED_KEY):
        event.listen(session, "before_commit", _before_commit)
        event.listen(session, "after_commit", _after_commit)
        event.listen(session, "after_soft_rollback", _after_soft_rollback)
        event.listen(session, "after_transaction_end", _after_transaction_end)
        session.info[HOOKED_KEY] = True
    root = session.get_transaction()
    if root is None:  # pragma: no cover - the marker insert began one
        raise RuntimeError("the session has no transaction")
    state = session.info.get(STATE_KEY)
    if state is None or state.root is not root:
        state = _SessionState(root)
        session.info[STATE_KEY] = state
    return state


def track(session: Session, store: BaseEventStore, sent: TransactionSendResult, topic: str,
          stream: str | None) -> None:
    """Remember a half message until the session's transaction (or its savepoint) ends."""
    state = session.info[STATE_KEY]
    state.pendings.append(_Pending(store, sent, topic, stream, _innermost(session)))
    if stream is not None:  # the broker numbered it after the live reservations: the rolled-back ones are gone
        state.rolled_back.pop((topic, stream), None)


def pending_count(session: Session) -> int:
    state = session.info.get(STATE_KEY)
    return len(state.live()) if state is not None else 0


def _within(tx: SessionTransaction | None, ancestor: SessionTransaction) -> bool:
    while tx is not None:
        if tx is ancestor:
            return True
        tx = tx.parent
    return False


def _end(p: _Pending, state: TransactionState) -> None:
    p.done = True
    try:
        p.store.transaction_producer.end_transaction(p.sent, state)
        p.store.ended(p.topic, p.stream, p.sent.stream_version)
    except Exception:  # never raise from a session event: the check-back settles it
        log.exception("END %s of %s failed; the check-back settles it", state.name, p.sent.transaction_id)
        return
    if state is TransactionState.COMMIT:
        p.store.settler.committed(p.sent.transaction_id, p.topic)


def _settle(p: _Pending, decide: bool) -> None:
    if decide:
        p.done = True
        p.store.settler.decide(p.sent, p.topic)
    else:
        _end(p, TransactionState.ROLLBACK)


def _before_commit(session: Session) -> None:
    state = session.info.get(STATE_KEY)
    if state is not None:
        state.commit_attempted = True


def _after_commit(session: Session) -> None:
    if session.get_nested_transaction() is not None:  # a savepoint was released: its appends wait for the root
        return
    state = session.info.get(STATE_KEY)
    if state is None or state.root is not session.get_transaction():
        return
    for p in state.live():
        _end(p, TransactionState.COMMIT)


def _after_soft_rollback(session: Session, previous: SessionTransaction) -> None:
    state = session.info.get(STATE_KEY)
    if state is None:
        return
    boundary = previous  # the transaction or savepoint the database rolled back
    while boundary.parent is not None and not boundary.nested:
        boundary = boundary.parent
    hit = [p for p in state.live() if _within(p.owner, boundary)]
    if not hit:
        return
    whole = boundary.parent is None
    if whole and state.root is not boundary:
        return
    for p in hit:
        _settle(p, decide=whole and state.commit_attempted)
        if not whole and p.stream is not None and p.sent.stream_version is not None:
            key = (p.topic, p.stream)
            state.rolled_back[key] = min(state.rolled_back.get(key, p.sent.stream_version), p.sent.stream_version)


def _after_transaction_end(session: Session, transaction: SessionTransaction) -> None:
    state = session.info.get(STATE_KEY)
    if state is None or transaction is not state.root:
        return
    del session.info[STATE_KEY]
    for p in state.live():  # neither committed nor rolled back by an event: closed, or a failed commit
        _settle(p, decide=state.commit_attempted)


# -- the settler: decisions after a failed commit, marker cleanup -------------------------------------------

class Settler:
    """A store's background thread: decides transactions whose commit failed (by the marker insert) and
    deletes resolved markers in batches (committed ones once the event is visible)."""

    RETRY = 0.5
    MAX_TRIES = 20
    FORGET_AFTER = 600.0  # a committed marker whose event never became visible is left to `sweep`

    def __init__(self, store: BaseEventStore, cleanup_interval: float, sweep_interval: float,
                 stale_after: float) -> None:
        self.store = store
        self.cleanup_interval = cleanup_interval
        self.sweep_interval = sweep_interval
        self.stale_after = stale_after
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._decide: list[tuple[TransactionSendResult, str, int, float]] = []  # sent, topic, tries, due
        self._committed: dict[str, tuple[str, float]] = {}  # txid -> (topic, since)
        self._rolled_back: set[str] = set()  # ROLLBACK markers this process inserted
        self._cleaned = 0.0
        self._swept = time.monotonic()

    def _start(self) -> None:
        with self._lock:
            if self._stop.is_set():
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rmq-eventstore-sqla-settler", daemon=True)
                self._thread.start()

    def decide(self, sent: TransactionSendResult, topic: str) -> None:
        with self._lock:
            self._decide.append((sent, topic, 0, 0.0))
        self._start()
        self._wake.set()

    def committed(self, txid: str, topic: str) -> None:
        with self._lock:
            self._committed[txid] = (topic, time.monotonic())
        self._start()

    def rolled_back(self, txid: str) -> None:
        with self._lock:
            self._rolled_back.add(txid)
        self._start()

    def pending(self) -> int:
        with self._lock:
            return len(self._decide) + len(self._committed) + len(self._rolled_back)

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(min(self.RETRY, self.cleanup_interval))
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.run_once()
            except Exception:  # pragma: no cover - keep going
                log.exception("marker settler round failed")

    def run_once(self, force: bool = False) -> None:
        """One round: due decisions, then (every `cleanup_interval`) the cleanup, (every `sweep_interval`)
        the sweep."""
        now = time.monotonic()
        with self._lock:
            due = [d for d in self._decide if d[3] <= now]
            self._decide = [d for d in self._decide if d[3] > now]
        for sent, topic, tries, _ in due:
            self._decide_one(sent, topic, tries)
        if force or now - self._cleaned >= self.cleanup_interval:
            self._cleaned = now
            self.clean()
        if force or now - self._swept >= self.sweep_interval:
            self._swept = now
            self.sweep(self.stale_after)

    def _decide_one(self, sent: TransactionSendResult, topic: str, tries: int) -> None:
        txid = sent.transaction_id
        state = self.store.markers.decide(txid, topic)
        if state is TransactionState.UNKNOWN:
            if tries + 1 >= self.MAX_TRIES:
                log.warning("transaction %s still undecided; the broker's check-back settles it", txid)
                return
            with self._lock:
                self._decide.append((sent, topic, tries + 1, time.monotonic() + self.RETRY))
            return
        self.store.transaction_producer.end_transaction(sent, state)
        if state is TransactionState.COMMIT:
            self.committed(txid, topic)
        else:
            self.rolled_back(txid)

    def clean(self) -> None:
        """Delete, in one statement, the markers of committed events the broker has ended (one
        QUERY_TRANSACTION_ENDS per topic; a transaction it does not remember ending is looked up by its event,
        one QUERY_MESSAGE each) and the ROLLBACK markers."""
        with self._lock:
            committed = list(self._committed.items())
            rolled = list(self._rolled_back)
        now = time.monotonic()
        done = list(rolled)
        forget = []
        ripe = [(txid, topic, since) for txid, (topic, since) in committed if now - since >= 0.05]
        by_topic: dict[str, list[str]] = {}
        for txid, topic, _ in ripe:
            by_topic.setdefault(topic, []).append(txid)
        ended: dict[str, str] = {}
        for topic, txids in by_topic.items():  # one request per topic: how the broker ended them
            try:
                ends = self.store.admin.transaction_ends(topic, txids)
            except Exception as e:  # looked up one by one below
                log.info("transaction ends of %s not asked (%s); looked up one by one", topic, e)
                ends = None
            if ends:
                ended.update(ends)
        for txid, topic, since in ripe:
            outcome = ended.get(txid)
            # the broker remembers the end (COMMIT: its record is written); else, as before, the event itself
            if outcome == "COMMIT" or (outcome is None and self.store.visible(topic, txid)):
                done.append(txid)
            elif now - since > self.FORGET_AFTER:
                forget.append(txid)
        if done:
            try:
                self.store.markers.delete(done)
            except SQLAlchemyError as e:
                log.info("markers not deleted yet: %s", e)
                return
        with self._lock:
            for txid in done + forget:
                self._committed.pop(txid, None)
                self._rolled_back.discard(txid)

    def sweep(self, older_than: float) -> int:
        """Delete this group's markers older than `older_than` seconds that are resolved: ROLLBACK ones, and
        committed ones whose event is visible (left behind by a process that died). Returns how many."""
        cutoff = datetime.now(UTC) - timedelta(seconds=older_than)
        try:
            rows = self.store.markers.older_than(cutoff)
        except SQLAlchemyError as e:
            log.info("marker sweep skipped: %s", e)
            return 0
        done = [txid for txid, topic, outcome in rows if outcome != COMMIT or self.store.visible(topic, txid)]
        if done:
            try:
                self.store.markers.delete(done)
            except SQLAlchemyError as e:
                log.info("marker sweep: not deleted yet: %s", e)
                return 0
        return len(done)
