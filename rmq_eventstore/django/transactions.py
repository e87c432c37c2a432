"""Appends bound to the database transaction: RocketMQ half messages plus a marker row.

Inside ``transaction.atomic()`` an append (1) inserts an `EventTransaction` marker row in the caller's
transaction while (2) the event is stored as a half message (invisible; it also reserves a stream
version): the half message's request is written, the insert runs, then the broker's answer is read, so
the two round trips overlap on one thread; and (3) registers ``on_commit`` to end it with COMMIT. A failed
marker insert rolls the half message back at once. So:

* the database commits → the event is committed right after (``on_commit``);
* the block raises, or the database commit fails → no ``on_commit``; the half message is rolled back,
  promptly by this process's watcher (it notices that the callback was discarded), else by the check-back;
* the process dies after the database commit, before the end → the broker asks any live member of the
  producer group (`check_transaction`), which finds the marker row and answers COMMIT.

The check-back decides with one insert: a check that finds no marker inserts one with outcome ROLLBACK in
its own transaction. While the original transaction is open its uncommitted marker holds the key (the
insert waits on PostgreSQL, or the database is locked on SQLite: the answer is then UNKNOWN and the broker
asks again), so either the original committed first (the insert conflicts: COMMIT) or the original can
never commit (its marker would conflict: its commit fails). The answer is the same for every process that
asks, and never both.

Marker rows are deleted once the committed event is visible in the store (or a ROLLBACK marker has done
its work), by the same watcher.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.db import DatabaseError, IntegrityError, connections, transaction

from ..client import ConcurrencyError as ClientConcurrencyError
from ..client import Message, TransactionState
from ..common import codec
from ..common.properties import PROPERTY_STREAM_TX_GROUP
from .exceptions import ConcurrencyError
from .marker import EventTransaction

if TYPE_CHECKING:
    from .connection import EventStore
    from .models import EventModel

log = logging.getLogger(__name__)

PROPERTY_DB_ALIAS = "DJANGO_DB"  # which database holds the marker row (read by the check-back)
WATCH_INTERVAL = 0.5
CLEANUP_INTERVAL = 5.0  # seconds between two batched deletions of resolved markers
OVERLAP_MARKER_INSERT = True  # False: insert the marker, then send the half message (benchmarks compare both)


def _keys_list(keys: str | Sequence[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [k for k in keys.split(" ") if k]
    return [str(k) for k in keys if k]


def _message(model: type[EventModel], data: Any, keys: Any, tags: str | None, body: bytes | None,
             properties: dict[str, str] | None) -> Message:
    if tags is None and model.tag_set and len(model.tag_set) == 1:
        tags = next(iter(model.tag_set))
    if model.tag_set and tags not in model.tag_set:
        raise ValueError(f"{model.__name__} holds events tagged {sorted(model.tag_set)}, not {tags!r}")
    payload = body if body is not None else model._codec_cache().encode(data)
    return Message(topic=model.topic, body=payload, tags=tags, keys=_keys_list(keys) or None,
                   properties=dict(properties) if properties else None)


def _instance(model: type[EventModel], msg: Message, sent: Any, uniq: str, version: int | None,
              stream: str | None, queue_offset: int, offset_msg_id: str, offset: int | None = None) -> EventModel:
    if offset is None:
        offset = _commit_log_offset(offset_msg_id)
    row = {
        "msg_id": uniq, "queue_id": sent.queue_id, "queue_offset": queue_offset, "commit_log_offset": offset,
        "born_at": None, "stored_at": None, "keys": " ".join(msg.keys_list()), "tags": msg.tags, "stream": stream,
        "version": version, "properties": dict(msg.properties or {}), "body": bytes(msg.body),
    }
    row["data"] = model._codec_cache().decode(row["body"])
    names = model.__dict__.get("_rmq_attnames")  # the model's own (a subclass has its own fields)
    if names is None:
        names = model._rmq_attnames = [f.attname for f in model._meta.concrete_fields]
    return model.from_row(None, names, row)


def _commit_log_offset(offset_msg_id: str) -> int:
    """The commit log offset an offset message id names (-1 for none)."""
    return codec.decode_message_id(offset_msg_id)[2] if offset_msg_id else -1


def append_events(model: type[EventModel], rows: list[tuple], stream: str | None, expected_version: int | None,
                  using: str | None) -> list[EventModel]:
    """Append `rows` ((data, keys, tags, body, properties) each) to the model's topic; see the module
    docstring for the transactional path."""
    from .connection import stores

    store = stores[model.store_alias]
    db = using or store.options["DATABASE"]
    msgs = [_message(model, *r) for r in rows]
    conn = connections[db]
    if conn.in_atomic_block:
        return _append_in_transaction(model, store, db, conn, msgs, stream, expected_version)
    producer = store.producer

    def send() -> Any:
        if len(msgs) == 1:
            return producer.send(msgs[0], stream=stream, expected_version=expected_version)
        return producer.send_batch(msgs, stream=stream, expected_version=expected_version)

    sent = _retrying_own_ends(send)
    uniqs = [sent.msg_id] if len(msgs) == 1 else sent.msg_id.split(",")
    last = sent.stream_version
    offset_ids = sent.offset_msg_id.split(",") if sent.offset_msg_id else []
    if len(offset_ids) != len(msgs):
        offset_ids = [""] * len(msgs)
    out = []
    for i, (m, u, oid) in enumerate(zip(msgs, uniqs, offset_ids, strict=True)):
        version = None if last is None else last - (len(msgs) - 1 - i)
        out.append(_instance(model, m, sent, u, version, stream, sent.queue_offset + i, oid))
    return out


def _append_in_transaction(model: type[EventModel], store: EventStore, db: str, conn: Any, msgs: list[Message],
                           stream: str | None, expected_version: int | None) -> list[EventModel]:
    producer = transaction_producer(store)
    group = _transaction_group(db, conn)
    out = []
    for i, msg in enumerate(msgs):
        uniq = producer._ids.create()
        msg.uniq_key = uniq
        msg.properties = {**(msg.properties or {}), PROPERTY_DB_ALIAS: db, PROPERTY_STREAM_TX_GROUP: group}
        expected = None if expected_version is None else expected_version + i
        marker = _MarkerInsert(db, uniq, store.alias, model.topic, conn)
        if OVERLAP_MARKER_INSERT:
            # The marker row is inserted while the half message's request is on its way and the broker
            # stores it (same thread: the request is written, the insert runs, then the answer is read).
            # Either order keeps the guarantee, as both are decided by the marker's key: a check-back that
            # came first would have inserted ROLLBACK and this insert fails.
            sent = _retrying_own_ends(lambda m=msg, x=expected, w=marker: producer.prepare(
                m, stream=stream, expected_version=x, while_waiting=w))
        else:  # the marker first, then the half message: one round trip after the other
            marker()
            if marker.error is not None:
                raise marker.error
            sent = _retrying_own_ends(lambda m=msg, x=expected: producer.prepare(m, stream=stream,
                                                                                 expected_version=x))
        if not marker.done:  # not run by the send (a code path that wrote no request): now
            marker()
        if marker.error is not None:
            if sent.status == "SEND_OK":  # stored already: rolled back at once
                producer.end_transaction(sent, TransactionState.ROLLBACK)
            raise marker.error
        if sent.status != "SEND_OK":
            raise DatabaseError(f"the half message of {model.__name__} was not stored ({sent.status})")
        offset = _commit_log_offset(sent.offset_msg_id)
        watcher.watch(store, db, sent, conn, producer, offset)
        out.append(_instance(model, msg, sent, uniq, sent.stream_version, stream, sent.queue_offset,
                             sent.offset_msg_id, offset))
    return out


class _MarkerInsert:
    """The marker row's insert, run once (by the half message's send, while its answer is awaited); an
    error is kept, not raised, and raised by the append once the half message's fate is known."""

    def __init__(self, db: str, txid: str, alias: str, topic: str, conn: Any = None) -> None:
        self.db, self.txid, self.alias, self.topic, self.conn = db, txid, alias, topic, conn
        self.done = False
        self.error: BaseException | None = None

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        try:
            EventTransaction.insert(self.db, self.txid, self.alias, self.topic, EventTransaction.COMMIT, self.conn)
        except BaseException as e:  # noqa: BLE001 - raised by the append, after the half message is settled
            self.error = e


_PENDING_TX = re.compile(r"pending transaction (\S+)")
OWN_END_GRACE = 2.0  # seconds an append waits for the broker to process an END this process sent


def _retrying_own_ends(send: Callable[[], Any]) -> Any:
    """`send()`, retried while the only conflict is a transaction this process ended moments ago.

    END_TRANSACTION is one-way: a request that commits and answers, followed at once by another append to
    the same stream, can reach the broker before the END did and find the stream still held. That is not
    a conflict with anybody else, so it is waited out (briefly); any other conflict raises at once."""
    deadline = time.monotonic() + OWN_END_GRACE
    while True:
        try:
            return send()
        except ClientConcurrencyError as e:
            m = _PENDING_TX.search(str(e))
            if m is None or not watcher.ended_recently(m.group(1)) or time.monotonic() > deadline:
                raise ConcurrencyError.from_client(e) from None
            time.sleep(0.005)


def _transaction_group(db: str, conn: Any = None) -> str:
    """An id for the current database transaction on `db`: its half messages may follow each other on one
    stream (the broker chains their versions, as they end together). A transaction is recognised by a
    no-op ``on_commit`` callback registered with its first append: Django drops it when the transaction
    ends (or when the savepoint it was registered in rolls back, which then starts a new group). `conn`:
    ``connections[db]``, when the caller has it."""
    if conn is None:
        conn = connections[db]
    state = getattr(conn, "_rmq_eventstore_tx_group", None)
    if state is not None and any(cb is state[1] for _, cb, _ in conn.run_on_commit):
        return state[0]

    def sentinel() -> None:
        pass

    group = os.urandom(16).hex()  # 32 hex digits, as uuid4().hex
    conn.on_commit(sentinel)  # transaction.on_commit(sentinel, using=db)
    conn._rmq_eventstore_tx_group = (group, sentinel)
    return group


# -- the decision, shared by the check-back and the watcher -----------------------------------------------

def decide(db: str, txid: str, store_alias: str = "default", topic: str = "") -> TransactionState:
    """COMMIT if the transaction's marker row is committed, ROLLBACK if it never can be, else UNKNOWN."""
    conn = connections[db]
    try:
        with transaction.atomic(using=db):
            if conn.vendor == "postgresql":
                with conn.cursor() as c:
                    c.execute("SET LOCAL lock_timeout = '2s'")
            EventTransaction.insert(db, txid, store_alias, topic, EventTransaction.ROLLBACK)
        return TransactionState.ROLLBACK
    except IntegrityError:
        row = EventTransaction.objects.using(db).filter(pk=txid).values_list("outcome", flat=True).first()
        if row is None:
            return TransactionState.UNKNOWN
        return TransactionState.COMMIT if row == EventTransaction.COMMIT else TransactionState.ROLLBACK
    except DatabaseError as e:  # locked / lock timeout: the original transaction is still open
        log.info("transaction %s is undecided for now (%s)", txid, e)
        return TransactionState.UNKNOWN
    finally:
        if threading.current_thread() is not threading.main_thread():
            conn.close()


def _settled(db: str, txid: str) -> TransactionState:
    """The outcome of a transaction of this process that is over (its ``on_commit`` callback is gone): its
    marker is committed, or it never will be. Django commits before it clears and runs the callbacks, and a
    rolled-back transaction or savepoint took its marker with it, so a read decides; no write is needed
    (which matters on SQLite, where a concurrent write can make another transaction's upgrade fail)."""
    try:
        found = EventTransaction.objects.using(db).filter(pk=txid, outcome=EventTransaction.COMMIT).exists()
    except DatabaseError as e:
        log.info("transaction %s: marker not readable yet (%s); the check-back settles it", txid, e)
        return TransactionState.UNKNOWN
    return TransactionState.COMMIT if found else TransactionState.ROLLBACK


def transaction_producer(store: EventStore) -> Any:
    """The store's member of its producer group in this process, answering check-backs from the markers."""
    return store.transaction_producer_with(lambda half: check_transaction(store, half))


def check_transaction(store: EventStore, half: Any) -> TransactionState:
    """The broker's check-back for a half message of this store's producer group."""
    txid = half.uniq_key or ""
    db = half.properties.get(PROPERTY_DB_ALIAS) or store.options["DATABASE"]
    if not txid:
        return TransactionState.ROLLBACK
    if db not in connections.settings:
        log.error("check-back for %s names database %r, which is not configured here", txid, db)
        return TransactionState.UNKNOWN
    topic = half.properties.get("REAL_TOPIC", "")
    state = decide(db, txid, store.alias, topic)
    log.info("check-back for %s: %s", txid, state.name)
    if state is TransactionState.COMMIT:  # its marker goes once the committed event is visible
        watcher.forget_after_visible(store, db, topic, txid)
    return state


# -- the watcher: prompt rollbacks and marker cleanup -----------------------------------------------------

@dataclass
class _Pending:
    store: EventStore
    db: str
    sent: Any
    conn_ref: Any
    callback: Any
    created: float = field(default_factory=time.monotonic)
    done: bool = False
    producer: Any = None  # the store's transaction producer (None: looked up at the end)
    offset: int | None = None  # the half message's commit log offset (None: read from its offset message id)


class _Watcher:
    """Ends this process's transactional appends: COMMIT from ``on_commit``; ROLLBACK once the callback was
    discarded (Django has no rollback hook); and deletes resolved markers."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._committed: dict[str, tuple[EventStore, str, str, float]] = {}  # txid -> (store, db, topic, when)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._cleaned = 0.0
        self._ended: dict[str, float] = {}  # txid -> when this process sent its END (for OWN_END_GRACE)

    def watch(self, store: EventStore, db: str, sent: Any, conn: Any = None, producer: Any = None,
              offset: int | None = None) -> None:
        """End `sent` (a half message sent inside the current transaction on `db`) with the transaction:
        COMMIT from ``on_commit``, ROLLBACK once that callback was discarded. `conn` (``connections[db]``),
        `producer` (the store's transaction producer) and `offset` (the half message's commit log offset):
        what the caller has at hand already."""
        if conn is None:
            conn = connections[db]
        txid = sent.transaction_id

        def on_commit() -> None:
            self._end(txid, TransactionState.COMMIT)

        p = _Pending(store, db, sent, weakref.ref(conn), on_commit, producer=producer, offset=offset)
        conn.on_commit(on_commit)  # (transaction.on_commit, using=db) before the sweep can see it pending
        with self._lock:
            self._pending[txid] = p
        t = self._thread
        if t is None or not t.is_alive():
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="rmq-eventstore-tx-watcher", daemon=True)
                self._thread.start()

    def _end(self, txid: str, state: TransactionState) -> None:
        now = time.monotonic()
        with self._lock:
            p = self._pending.pop(txid, None)
            if p is None or p.done:
                return
            p.done = True
            self._ended[txid] = now
            if len(self._ended) > 10_000:
                self._ended = {t: w for t, w in self._ended.items() if now - w < OWN_END_GRACE}
        producer = p.producer
        if producer is None or producer is not p.store._tx_producer:  # none given, or replaced since
            producer = transaction_producer(p.store)
        producer.end_transaction(p.sent, state, offset=p.offset)
        if state is TransactionState.COMMIT:
            with self._lock:
                self._committed[txid] = (p.store, p.db, p.sent.topic, time.monotonic())
        # no wake-up of the watcher: its next sweep (WATCH_INTERVAL) cleans up. Waking it per commit made it
        # take the GIL from the request thread at its next blocking call, for a sweep with nothing to do.

    def ended_recently(self, txid: str) -> bool:
        with self._lock:
            when = self._ended.get(txid)
        return when is not None and time.monotonic() - when < OWN_END_GRACE

    def forget_after_visible(self, store: EventStore, db: str, topic: str, txid: str) -> None:
        with self._lock:
            self._committed[txid] = (store, db, topic, time.monotonic())
        self._start()

    def pending_count(self) -> int:
        with self._lock:
            return len(self._pending)

    @staticmethod
    def _discarded(p: _Pending, queued: dict[int, tuple[Any, set[int]]]) -> bool:
        """Whether Django dropped `p`'s ``on_commit`` callback; `queued`: per connection (by id), the ids of
        the callbacks in its ``run_on_commit``, read once per sweep (one atomic block appending n events holds
        n pending appends: looking each up in the list was n * n a sweep)."""
        conn = p.conn_ref()
        if conn is None:
            return True
        seen = queued.get(id(conn))
        if seen is None:  # the connection is kept with its ids: no other takes its id during the sweep
            seen = queued[id(conn)] = (conn, {id(cb) for _, cb, _ in list(conn.run_on_commit)})
        return id(p.callback) not in seen[1]

    def _run(self) -> None:
        while True:
            self._wake.wait(WATCH_INTERVAL)
            self._wake.clear()
            try:
                self.sweep()
            except Exception:  # pragma: no cover - keep watching
                log.exception("transaction watcher sweep failed")
            finally:
                for alias in connections:
                    connections[alias].close()

    def sweep(self) -> None:
        """Settle appends whose ``on_commit`` callback Django discarded, and clean markers up."""
        now = time.monotonic()
        with self._lock:
            pending = [(t, p) for t, p in self._pending.items() if now - p.created > 0.05]
        queued: dict[int, tuple[Any, set[int]]] = {}  # connection id -> (it, its callbacks' ids), per sweep
        for txid, p in pending:
            if p.done or not self._discarded(p, queued):
                continue
            self._end(txid, _settled(p.db, txid))
        if now - self._cleaned >= CLEANUP_INTERVAL:
            self._cleaned = now
            self.clean_markers()

    def clean_markers(self) -> None:
        """Delete, in one statement per database, the markers of committed events the broker has ended (a
        marker must outlive a lost one-way END: the check-back reads it). The broker is asked once per topic
        (`Admin.transaction_ends`); a transaction it does not remember ending (a restart since) is looked up
        by its event, one QUERY_MESSAGE each, as before that request existed."""
        with self._lock:
            committed = list(self._committed.items())
        by_topic: dict[tuple[Any, str], list[str]] = {}
        for txid, (store, _db, topic, _) in committed:
            by_topic.setdefault((store, topic), []).append(txid)
        ended: dict[str, str] = {}
        for (store, topic), txids in by_topic.items():  # one request per topic: how the broker ended them
            try:
                ends = store.admin.transaction_ends(topic, txids)
            except Exception as e:  # looked up one by one below
                log.info("transaction ends of %s not asked (%s); looked up one by one", topic, e)
                ends = None
            if ends:
                ended.update(ends)
        by_db: dict[str, list[str]] = {}
        for txid, (store, db, topic, _) in committed:
            outcome = ended.get(txid)
            # the broker remembers the end (COMMIT: its record is written); else, as before, the event itself
            if outcome == "COMMIT" or (outcome is None and self._visible(store, topic, txid)):
                by_db.setdefault(db, []).append(txid)
        for db, txids in by_db.items():
            try:
                EventTransaction.objects.using(db).filter(pk__in=txids).delete()
            except DatabaseError as e:
                log.info("markers not deleted yet: %s", e)
                continue
            with self._lock:
                for txid in txids:
                    self._committed.pop(txid, None)

    @staticmethod
    def _visible(store: EventStore, topic: str, txid: str) -> bool:
        try:
            return any(m.uniq_key == txid for m in store.admin.query_message(topic, txid, 4))
        except Exception:
            return False


watcher = _Watcher()
