"""`EventStore` and `AsyncEventStore`: appends bound to a SQLAlchemy session's transaction, and reads.

    engine = create_engine("postgresql+psycopg://app@db/shop")
    store = EventStore("file:///srv/var/store", engine, producer_group="shop")
    store.create_tables()                                # or Alembic, see `marker`

    with Session(engine) as session, session.begin():
        session.add(Order(number="A-1"))
        store.append(session, "Orders", {"placed": "A-1"}, stream="order-A-1", expected_version=0)
    # committed together: the event is visible once the database committed

    store.append(None, "Audit", {"no": "transaction"})  # an immediate append
    store.read_stream("Orders", "order-A-1")             # [Event(version=1, data={"placed": "A-1"}, ...)]

See ``transactions`` for how an append inside a transaction is committed or rolled back with it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, delete, insert
from sqlalchemy.engine import URL, Engine
from sqlalchemy.orm import Session

from ..client import Admin, Message, MessageExt, Producer, TransactionProducer, TransactionState
from ..client import ConcurrencyError as ClientConcurrencyError
from ..client.local import parse_url, resolve_namesrv
from ..common.message_id import UniqueIdGenerator
from ..common.properties import PROPERTY_STREAM_ID, PROPERTY_STREAM_TX_GROUP, PROPERTY_STREAM_VERSION
from . import transactions
from .marker import COMMIT, as_table
from .transactions import AsyncRunner, MarkerStore, Settler, SyncRunner

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

log = logging.getLogger(__name__)

DEFAULT_GROUP = "rmq_eventstore_sqlalchemy"

# RocketMQ's own properties (MessageConst) and ours: fields of `Event`, or bookkeeping, not user properties
SYSTEM_PROPERTIES = frozenset((
    "KEYS", "TAGS", "UNIQ_KEY", "WAIT", "STREAM_ID", "STREAM_VERSION", "STREAM_TX_GROUP", "TRAN_MSG", "PGROUP",
    "REAL_TOPIC", "REAL_QID", "TRAN_PREPARED_QUEUE_OFFSET", "MAX_OFFSET", "MIN_OFFSET", "CLUSTER", "MSG_REGION",
    "TRACE_ON", "DELAY", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES",
    "CHECK_IMMUNITY_TIME_IN_SECONDS", "TRANSACTION_CHECK_TIMES", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC",
    "TIMER_DELAY_MS", "TIMER_OUT_MS", "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "POP_CK", "__CRC32#",
))


class ConcurrencyError(ClientConcurrencyError):
    """An expected-version append found the stream at another version (someone appended first, or an open
    transaction holds the stream): nothing was appended, and the session's transaction is left as it was
    (the append's marker row is removed), so the caller may retry or give up. ``stream``,
    ``expected_version`` and ``current_version`` say what was found; ``status_code`` is 409 for web
    handlers. A subclass of the client's `ConcurrencyError`, so either can be caught."""

    status_code = 409

    @classmethod
    def from_client(cls, e: ClientConcurrencyError) -> ConcurrencyError:
        return cls(str(e), e.stream, e.expected_version, e.current_version)


class AppendError(RuntimeError):
    """The broker did not store the event (a status other than SEND_OK); nothing will be visible."""


@dataclass(frozen=True)
class NewEvent:
    """One event of `bulk_append` with its own keys, tags or properties (plain data is fine otherwise).
    `body` (bytes) replaces the encoded `data`."""

    data: Any = None
    keys: str | Sequence[str] | None = None
    tags: str | None = None
    properties: dict[str, str] | None = None
    body: bytes | None = None


@dataclass(frozen=True)
class Event:
    """An event as appended or read. For an append inside a transaction (``pending``) the store position
    (queue, offsets, times) is not known yet: it is set when the event is read back after the commit."""

    topic: str
    msg_id: str
    data: Any
    body: bytes
    stream: str | None = None
    version: int | None = None
    keys: tuple[str, ...] = ()
    tags: str | None = None
    properties: dict[str, str] = field(default_factory=dict)
    queue_id: int | None = None
    queue_offset: int | None = None
    commit_log_offset: int | None = None
    born_at: datetime | None = None
    stored_at: datetime | None = None
    pending: bool = False


def json_encode(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False, default=str).encode()


def json_decode(body: bytes) -> Any:
    return json.loads(body)


def _keys_list(keys: str | Sequence[str] | None) -> list[str]:
    if keys is None:
        return []
    if isinstance(keys, str):
        return [k for k in keys.split(" ") if k]
    return [str(k) for k in keys if k]


def _ms(ts: int) -> datetime | None:
    return datetime.fromtimestamp(ts / 1000, UTC) if ts > 0 else None


def _same_database(a: URL, b: URL) -> bool:
    return (a.get_backend_name(), a.host, a.port, a.database) == (b.get_backend_name(), b.host, b.port, b.database)


class BaseEventStore:
    """What the sync and the async store share: the clients, the marker table, the settler and reads.

    `url`: ``rmq://host:port`` (a name server) or ``file:///path`` (a local store: the one broker process
    that owns it is found or started, see ``client.local``; with ``embedded=True`` it is served by a broker
    thread of this process instead, for tests and single-process scripts). `producer_group`: the
    transaction producer group; every process of the application that appends in transactions must use
    the same group and the same marker table, so that any of them can answer a check-back."""

    ROLLBACK_WAIT = 2.0  # seconds an append waits for the broker to handle a rolled-back savepoint's END

    def __init__(self, url: str, *, producer_group: str = DEFAULT_GROUP, marker: Any = None,
                 embedded: bool = False, broker_options: dict[str, Any] | None = None, send_timeout_ms: int = 3000,
                 encode: Callable[[Any], bytes] = json_encode, decode: Callable[[bytes], Any] = json_decode,
                 cleanup_interval: float = 2.0, sweep_interval: float = 60.0, stale_after: float = 300.0,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        kind, _ = parse_url(url)
        if embedded and kind != "file":
            raise ValueError(f"embedded=True needs a file:// store URL, not {url!r}")
        self.url = url
        self.producer_group = producer_group
        self.table: Table = as_table(marker)
        self.embedded = embedded
        self.broker_options = dict(broker_options or {})
        self.send_timeout_ms = send_timeout_ms
        self.encode = encode
        self.decode = decode
        self._credentials = {"access_key": access_key, "secret_key": secret_key}
        self._lock = threading.RLock()
        self._namesrv: str | None = None
        self._running: Any = None  # the embedded broker
        self._admin: Admin | None = None
        self._producer: Producer | None = None
        self._tx_producer: TransactionProducer | None = None
        self._ids = UniqueIdGenerator()
        self._recent_ends: dict[tuple[str, str], tuple[int, float]] = {}
        self.markers: MarkerStore = MarkerStore(self.table, producer_group, self._runner())
        self.settler = Settler(self, cleanup_interval, sweep_interval, stale_after)
        self._closed = False

    def _runner(self) -> Callable[..., Any]:  # pragma: no cover - overridden
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.url} group={self.producer_group}>"

    # -- clients --------------------------------------------------------------------------------------

    @property
    def namesrv(self) -> str:
        """The name-server address (a local store's broker is found, started, or served here first)."""
        with self._lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._namesrv is None:
                if self.embedded:
                    from ..broker.server import serve_in_thread  # embedded mode only

                    _, path = parse_url(self.url)
                    self._running = serve_in_thread(path, "127.0.0.1", 0, 0, **self.broker_options)
                    self._namesrv = self._running.namesrv_address
                elif self.broker_options:
                    self._namesrv = resolve_namesrv(self.url, broker_options=self.broker_options)
                else:
                    self._namesrv = resolve_namesrv(self.url)
            return self._namesrv

    @property
    def admin(self) -> Admin:
        with self._lock:
            if self._admin is None:
                self._admin = Admin(self.namesrv, self.send_timeout_ms, **self._credentials).start()
            return self._admin

    @property
    def producer(self) -> Producer:
        """The plain producer (appends outside transactions)."""
        with self._lock:
            if self._producer is None:
                self._producer = Producer(self.namesrv, f"{self.producer_group}_plain", self.send_timeout_ms,
                                          **self._credentials).start()
            return self._producer

    @property
    def transaction_producer(self) -> TransactionProducer:
        """This process's member of the producer group: sends the half messages and answers the broker's
        check-backs from the marker table."""
        with self._lock:
            if self._tx_producer is None:
                self._tx_producer = TransactionProducer(
                    self.namesrv, self.producer_group, self.check_transaction, send_timeout_ms=self.send_timeout_ms,
                    **self._credentials).start()
            return self._tx_producer

    def start(self) -> BaseEventStore:
        """Join the producer group now (every process that should answer check-backs calls this at
        start-up; appends in a transaction join it anyway)."""
        _ = self.transaction_producer
        return self

    def close(self) -> None:
        """Stop the settler, shut the clients down (and the embedded broker). Markers not cleaned yet are
        left to any other member's check-back or sweep."""
        self.settler.stop()
        with self._lock:
            self._closed = True
            for client in (self._tx_producer, self._producer, self._admin):
                if client is not None:
                    try:
                        client.shutdown()
                    except Exception:  # pragma: no cover - best effort
                        log.exception("closing a client of %r failed", self)
            self._tx_producer = self._producer = self._admin = None
            if self._running is not None:
                self._running.close()
                self._running = None
        self.markers.close()

    def __enter__(self) -> BaseEventStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the check-back ---------------------------------------------------------------------------------

    def ended(self, topic: str, stream: str | None, version: int | None) -> None:
        """This process sent the END of the half message holding `version` of `stream` (one-way)."""
        if stream is None or version is None:
            return
        with self._lock:
            now = time.monotonic()
            if len(self._recent_ends) > 4096:
                self._recent_ends = {k: v for k, v in self._recent_ends.items() if now - v[1] < self.ROLLBACK_WAIT}
            self._recent_ends[(topic, stream)] = (version, now)

    def _ending(self, topic: str, e: ClientConcurrencyError) -> bool:
        """Whether the conflict `e` is a reservation this process has just ended: END_TRANSACTION is one-way,
        so an append right after a commit (the next request on the same stream) may reach the broker first.
        Such an append is retried briefly instead of failing."""
        with self._lock:
            seen = self._recent_ends.get((topic, e.stream))
        return (seen is not None and time.monotonic() - seen[1] < self.ROLLBACK_WAIT
                and e.current_version == seen[0] and "pending transaction" in str(e))

    def check_transaction(self, half: MessageExt) -> TransactionState:
        """The broker's check-back for a half message of this producer group (on a client thread)."""
        txid = half.uniq_key or ""
        if not txid:
            return TransactionState.ROLLBACK
        topic = half.properties.get("REAL_TOPIC", "")
        state = self.markers.decide(txid, topic)
        log.info("check-back for %s: %s", txid, state.name)
        if state is TransactionState.COMMIT:  # its marker goes once the committed event is visible
            self.settler.committed(txid, topic)
        elif state is TransactionState.ROLLBACK:
            self.settler.rolled_back(txid)
        return state

    def visible(self, topic: str, txid: str) -> bool:
        """Whether the committed event `txid` can be read on `topic`."""
        try:
            return any(m.uniq_key == txid for m in self.admin.query_message(topic, txid, 4))
        except Exception:
            return False

    def clean_markers(self) -> None:
        """Run the settler's round now (decisions due, cleanup, sweep); tests and shutdown hooks."""
        self.settler.run_once(force=True)

    def sweep_markers(self, older_than: float = 300.0) -> int:
        """Delete resolved markers of this group older than `older_than` seconds; see `Settler.sweep`."""
        return self.settler.sweep(older_than)

    # -- messages and events ----------------------------------------------------------------------------

    def _messages(self, topic: str, items: Iterable[Any]) -> list[Message]:
        msgs = []
        for item in items:
            ev = item if isinstance(item, NewEvent) else NewEvent(item)
            body = ev.body if ev.body is not None else self.encode(ev.data)
            msgs.append(Message(topic=topic, body=body, tags=ev.tags, keys=_keys_list(ev.keys) or None,
                                properties=dict(ev.properties) if ev.properties else None))
        if not msgs:
            raise ValueError("nothing to append")
        return msgs

    def _decode(self, body: bytes) -> Any:
        try:
            return self.decode(body)
        except Exception:
            return bytes(body)

    def _appended(self, msg: Message, msg_id: str, stream: str | None, version: int | None, pending: bool,
                  queue_id: int | None = None, queue_offset: int | None = None) -> Event:
        return Event(topic=msg.topic, msg_id=msg_id, data=self._decode(bytes(msg.body)), body=bytes(msg.body),
                     stream=stream, version=version, keys=tuple(msg.keys_list()), tags=msg.tags,
                     properties={k: v for k, v in (msg.properties or {}).items() if k not in SYSTEM_PROPERTIES},
                     queue_id=queue_id, queue_offset=queue_offset,
                     pending=pending)

    def event_from(self, m: MessageExt) -> Event:
        """An `Event` from a stored message."""
        props = m.properties
        version = props.get(PROPERTY_STREAM_VERSION)
        return Event(topic=m.topic, msg_id=m.uniq_key or m.msg_id, data=self._decode(m.body), body=bytes(m.body),
                     stream=props.get(PROPERTY_STREAM_ID), version=int(version) if version else None,
                     keys=tuple(m.keys_list()), tags=m.tags,
                     properties={k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES}, queue_id=m.queue_id,
                     queue_offset=m.queue_offset, commit_log_offset=m.commit_log_offset,
                     born_at=_ms(m.born_timestamp), stored_at=_ms(m.store_timestamp))

    def _send_plain(self, msgs: list[Message], stream: str | None, expected_version: int | None) -> list[Event]:
        deadline = time.monotonic() + self.ROLLBACK_WAIT
        while True:
            try:
                if len(msgs) == 1:
                    sent = self.producer.send(msgs[0], stream=stream, expected_version=expected_version)
                    ids = [sent.msg_id]
                else:
                    sent = self.producer.send_batch(msgs, stream=stream, expected_version=expected_version)
                    ids = sent.msg_id.split(",")
                break
            except ClientConcurrencyError as e:
                if self._ending(msgs[0].topic, e) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise ConcurrencyError.from_client(e) from None
        if sent.status != "SEND_OK":
            raise AppendError(f"the broker answered {sent.status}")
        last = sent.stream_version
        n = len(msgs)
        return [self._appended(m, u, stream, None if last is None else last - (n - 1 - i), False, sent.queue_id,
                               sent.queue_offset + i) for i, (m, u) in enumerate(zip(msgs, ids, strict=True))]

    def _marker_row(self, txid: str, topic: str) -> Any:
        return insert(self.table).values(transaction_id=txid, producer_group=self.producer_group, topic=topic,
                                         outcome=COMMIT, created_at=datetime.now(UTC))

    def _unmark(self, txid: str) -> Any:
        return delete(self.table).where(self.table.c.transaction_id == txid)

    def _prepare(self, msg: Message, txid: str, group: str, stream: str | None, expected: int | None,
                 retry: bool = False) -> Any:
        """Store `msg` as a half message (blocking; the async store runs it on a thread). With `retry`, a
        conflict is retried for up to `ROLLBACK_WAIT` seconds (see `_SessionState.expected_after_rollback`),
        as is one with a transaction this process has just ended (`_ending`)."""
        msg.uniq_key = txid
        msg.properties = {**(msg.properties or {}), PROPERTY_STREAM_TX_GROUP: group}
        deadline = time.monotonic() + self.ROLLBACK_WAIT
        while True:
            try:
                sent = self.transaction_producer.prepare(msg, stream=stream, expected_version=expected)
                break
            except ClientConcurrencyError as e:
                if (retry or self._ending(msg.topic, e)) and time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                raise ConcurrencyError.from_client(e) from None
        if sent.status != "SEND_OK":
            raise AppendError(f"the half message was not stored ({sent.status})")
        return sent

    # -- reads (blocking) -------------------------------------------------------------------------------

    def _read_stream(self, topic: str, stream: str, from_version: int = 1) -> list[Event]:
        return [self.event_from(m) for m in self.admin.read_stream(topic, stream, from_version)]

    def _find(self, topic: str, key: str) -> list[Event]:
        return [self.event_from(m) for m in self.admin.query_key_all(topic, key)]

    def _get(self, topic: str, msg_id: str) -> Event | None:
        for m in self.admin.query_message(topic, msg_id, 4):
            if m.uniq_key == msg_id:
                return self.event_from(m)
        return None


class EventStore(BaseEventStore):
    """Appends bound to a sync `Session`'s transaction (see the module docstring); thread-safe, one per
    process and store. `engine`: the database of the sessions and of the marker table, used by the
    check-back and the cleanup in their own transactions."""

    def __init__(self, url: str, engine: Engine, **kwargs: Any) -> None:
        if not isinstance(engine, Engine):
            raise TypeError(f"engine must be a sqlalchemy Engine, not {type(engine).__name__} "
                            "(AsyncEventStore takes an AsyncEngine)")
        self.engine = engine
        super().__init__(url, **kwargs)

    def _runner(self) -> Callable[..., Any]:
        return SyncRunner(self.engine)

    def create_tables(self) -> None:
        """Create the marker table if it does not exist (``checkfirst``); migrations can own it instead."""
        self.table.create(self.engine, checkfirst=True)

    def _check_session(self, session: Session) -> None:
        bind = session.get_bind(clause=self.table.insert())
        engine = getattr(bind, "engine", bind)
        if engine is not self.engine and not _same_database(engine.url, self.engine.url):
            raise ValueError(f"the session writes to {engine.url!r}, the store's markers live in "
                             f"{self.engine.url!r}: the check-back could not find them")

    def append(self, session: Session | None, topic: str, data: Any = None, *, keys: str | Sequence[str] | None = None,
               tags: str | None = None, stream: str | None = None, expected_version: int | None = None,
               properties: dict[str, str] | None = None, body: bytes | None = None) -> Event:
        """Append one event to `topic`. With a `session`, it commits or rolls back with the session's
        transaction (begun if needed; see ``transactions``); with None, it is stored now.

        `stream` makes it the stream's next event (its version in ``Event.version``); `expected_version`
        (0: the stream must not exist yet) makes it conditional: `ConcurrencyError` if the stream is
        elsewhere or held by another open transaction."""
        return self.bulk_append(session, topic, [NewEvent(data, keys, tags, properties, body)], stream=stream,
                                expected_version=expected_version)[0]

    def bulk_append(self, session: Session | None, topic: str, items: Iterable[Any], *, stream: str | None = None,
                    expected_version: int | None = None) -> list[Event]:
        """Append several events (data, or `NewEvent`) in order. Without a session: one batch, all or
        nothing. With one: a half message each, all ending with the transaction."""
        msgs = self._messages(topic, items)
        if session is None:
            return self._send_plain(msgs, stream, expected_version)
        self._check_session(session)
        out = []
        for i, msg in enumerate(msgs):
            txid = self._ids.create()
            session.execute(self._marker_row(txid, topic))
            state = transactions.begin_append(session)
            expected, retry = state.expected_after_rollback(
                topic, stream, None if expected_version is None else expected_version + i)
            try:
                sent = self._prepare(msg, txid, state.group, stream, expected, retry)
            except BaseException:
                try:  # the transaction stays usable; a half message stored despite the error is rolled back
                    session.execute(self._unmark(txid))
                except Exception:
                    log.warning("the marker of the failed append %s was not removed", txid, exc_info=True)
                raise
            transactions.track(session, self, sent, topic, stream)
            out.append(self._appended(msg, txid, stream, sent.stream_version, True))
        return out

    def read_stream(self, topic: str, stream: str, from_version: int = 1) -> list[Event]:
        """The committed events of `stream` in version order, from `from_version` on."""
        return self._read_stream(topic, stream, from_version)

    def find(self, topic: str, key: str) -> list[Event]:
        """The committed events of `topic` whose keys hold `key`, oldest first."""
        return self._find(topic, key)

    def get(self, topic: str, msg_id: str) -> Event | None:
        """The committed event `msg_id` (as `append` returned it), or None."""
        return self._get(topic, msg_id)


class AsyncEventStore(BaseEventStore):
    """The `EventStore` for `AsyncSession`s (SQLAlchemy's asyncio extension). The session's events are the
    sync session's, so commit and rollback end the half messages the same way; blocking client calls run
    on a thread (``asyncio.to_thread``). Check-backs and cleanup run on a private event loop over
    `marker_engine` (default: a `NullPool` engine on the same URL; async pools are bound to one loop)."""

    def __init__(self, url: str, engine: AsyncEngine, *, marker_engine: Callable[[], AsyncEngine] | None = None,
                 **kwargs: Any) -> None:
        from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
        from sqlalchemy.pool import NullPool

        if not isinstance(engine, AsyncEngine):
            raise TypeError(f"engine must be an AsyncEngine, not {type(engine).__name__} (EventStore takes an Engine)")
        self.engine = engine
        self._marker_engine = marker_engine or (lambda: create_async_engine(engine.url, poolclass=NullPool))
        super().__init__(url, **kwargs)

    def _runner(self) -> Callable[..., Any]:
        return AsyncRunner(self._marker_engine)

    async def create_tables(self) -> None:
        async with self.engine.begin() as conn:
            await conn.run_sync(lambda c: self.table.create(c, checkfirst=True))

    def _check_session(self, session: AsyncSession) -> None:
        bind = session.sync_session.get_bind(clause=self.table.insert())
        engine = getattr(bind, "engine", bind)
        if engine is not self.engine.sync_engine and not _same_database(engine.url, self.engine.url):
            raise ValueError(f"the session writes to {engine.url!r}, the store's markers live in "
                             f"{self.engine.url!r}: the check-back could not find them")

    async def start_async(self) -> AsyncEventStore:
        await asyncio.to_thread(self.start)
        return self

    async def append(self, session: AsyncSession | None, topic: str, data: Any = None, *,
                     keys: str | Sequence[str] | None = None, tags: str | None = None, stream: str | None = None,
                     expected_version: int | None = None, properties: dict[str, str] | None = None,
                     body: bytes | None = None) -> Event:
        """`EventStore.append` for an `AsyncSession` (or None)."""
        return (await self.bulk_append(session, topic, [NewEvent(data, keys, tags, properties, body)], stream=stream,
                                       expected_version=expected_version))[0]

    async def bulk_append(self, session: AsyncSession | None, topic: str, items: Iterable[Any], *,
                          stream: str | None = None, expected_version: int | None = None) -> list[Event]:
        msgs = self._messages(topic, items)
        if session is None:
            return await asyncio.to_thread(self._send_plain, msgs, stream, expected_version)
        self._check_session(session)
        out = []
        for i, msg in enumerate(msgs):
            txid = self._ids.create()
            await session.execute(self._marker_row(txid, topic))
            state = transactions.begin_append(session.sync_session)
            expected, retry = state.expected_after_rollback(
                topic, stream, None if expected_version is None else expected_version + i)
            try:
                sent = await asyncio.to_thread(self._prepare, msg, txid, state.group, stream, expected, retry)
            except BaseException:
                try:
                    await session.execute(self._unmark(txid))
                except Exception:
                    log.warning("the marker of the failed append %s was not removed", txid, exc_info=True)
                raise
            transactions.track(session.sync_session, self, sent, topic, stream)
            out.append(self._appended(msg, txid, stream, sent.stream_version, True))
        return out

    async def read_stream(self, topic: str, stream: str, from_version: int = 1) -> list[Event]:
        return await asyncio.to_thread(self._read_stream, topic, stream, from_version)

    async def find(self, topic: str, key: str) -> list[Event]:
        return await asyncio.to_thread(self._find, topic, key)

    async def get(self, topic: str, msg_id: str) -> Event | None:
        return await asyncio.to_thread(self._get, topic, msg_id)

    async def aclose(self) -> None:
        await asyncio.to_thread(self.close)
