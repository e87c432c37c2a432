"""`stores`: the configured event stores, opened on first use and shared by every thread of the process.

An `EventStore` is one alias of ``RMQ_EVENTSTORE``: a name-server address and the thread-safe clients
over it (an `Admin` for lookups, a `PullConsumer` for queue reads, a `Producer` for plain appends and a
`TransactionProducer` for appends inside database transactions). Unlike Django's database connections
these are process-wide, not per thread: the clients are thread-safe and each holds sockets and a
heartbeat thread, and the transaction producer must be one registered member of its producer group.

How the address is found depends on the URL (see ``conf``): ``rmq://host:port`` is a name server;
``file:///path`` with ``MODE = "shared"`` (the default) finds the one broker process that owns the store
or starts one (``rmq_eventstore.client.local``), so any number of web and worker processes share it;
``MODE = "embedded"`` serves the store from a broker thread inside this process (tests, scripts, a single
process that owns the store).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..client import Admin, Producer, PullConsumer, TransactionProducer
from ..client.local import _pid_alive
from ..client.remoting_client import MQBrokerError
from ..common.broker_file import read_broker_file
from ..remoting import ResponseCode
from .conf import DEFAULT_ALIAS, StoreSettings, configured_aliases, store_settings

log = logging.getLogger(__name__)

READER_GROUP = "rmq_eventstore_django_reader"

_embedded: dict[str, Any] = {}  # store path -> RunningBroker served by this process
_embedded_lock = threading.Lock()


def _embedded_broker(path: str, options: dict[str, Any]) -> str:
    from ..broker.server import serve_in_thread

    with _embedded_lock:
        running = _embedded.get(path)
        if running is None or running.closed:
            running = serve_in_thread(path, "127.0.0.1", 0, 0, **dict(options))
            _embedded[path] = running
        return running.namesrv_address


def close_embedded_brokers() -> None:
    """Shut down the brokers this process serves in embedded mode (tests; also at exit)."""
    with _embedded_lock:
        running = list(_embedded.values())
        _embedded.clear()
    for r in running:
        try:
            r.close()
        except Exception:  # pragma: no cover - best effort at exit
            log.exception("closing the embedded broker failed")


atexit.register(close_embedded_brokers)


class EventStore:
    """One store alias: its name server and lazily started, thread-safe clients."""

    def __init__(self, settings: StoreSettings) -> None:
        self.settings = settings
        self.alias = settings.alias
        self._lock = threading.RLock()
        self._namesrv: str | None = None
        self._admin: Admin | None = None
        self._reader: PullConsumer | None = None
        self._producer: Producer | None = None
        self._tx_producer: TransactionProducer | None = None
        self._checked_at = 0.0
        # shared mode: the broker process is looked for again at most once a second (`_follow_local_broker`)
        self._follows = settings.kind == "file" and settings.mode == "shared"

    def __repr__(self) -> str:
        return f"<EventStore {self.alias!r} {self.settings.url}>"

    @property
    def options(self) -> dict[str, Any]:
        return self.settings.options

    def _follow_local_broker(self) -> None:
        """Shared mode: when the broker that owned the store is gone (it idled out, crashed, was restarted),
        drop the clients so the next use finds or starts the new one. Checked at most once a second (a
        small file read)."""
        now = time.monotonic()
        if self._namesrv is None or now - self._checked_at < 1.0:
            return
        self._checked_at = now
        info = read_broker_file(self.settings.path or "")
        if info is None or info.get("namesrv") != self._namesrv or not _pid_alive(int(info.get("pid") or 0)):
            log.info("the broker of %s moved or is gone; reconnecting", self.settings.path)
            self._close_clients()

    @property
    def namesrv(self) -> str:
        """The name-server address; for a local store, the broker is found or started here."""
        with self._lock:
            if self.settings.kind == "file" and self.settings.mode == "shared":
                self._follow_local_broker()
            if self._namesrv is None:
                s = self.settings
                if s.kind == "rmq":
                    self._namesrv = s.namesrv
                elif s.mode == "embedded":
                    self._namesrv = _embedded_broker(s.path or "", s.options.get("BROKER") or {})
                else:
                    from ..client.local import ensure_local_broker

                    self._namesrv = ensure_local_broker(s.path or "",
                                                        broker_options=s.options.get("BROKER") or {}).namesrv_addr
            return self._namesrv

    def _refresh(self) -> None:
        if self.settings.kind == "file" and self.settings.mode == "shared":
            self._follow_local_broker()

    def _credentials(self) -> dict[str, Any]:
        return {"access_key": self.options.get("ACCESS_KEY"), "secret_key": self.options.get("SECRET_KEY")}

    @property
    def admin(self) -> Admin:
        with self._lock:
            self._refresh()
            if self._admin is None:
                self._admin = Admin(self.namesrv, self.options["SEND_TIMEOUT_MS"], **self._credentials()).start()
            return self._admin

    @property
    def reader(self) -> PullConsumer:
        with self._lock:
            self._refresh()
            if self._reader is None:
                self._reader = PullConsumer(self.namesrv, READER_GROUP, self.options["SEND_TIMEOUT_MS"],
                                            **self._credentials()).start()
            return self._reader

    @property
    def producer(self) -> Producer:
        with self._lock:
            self._refresh()
            if self._producer is None:
                self._producer = Producer(self.namesrv, f"{self.options['PRODUCER_GROUP']}_plain",
                                          self.options["SEND_TIMEOUT_MS"], **self._credentials()).start()
            return self._producer

    def transaction_producer_with(self, checker: Any) -> TransactionProducer:
        """The member of ``PRODUCER_GROUP`` in this process (created on first use with `checker`, which
        answers the broker's check-back; any live process of the group can settle a transaction)."""
        p = self._tx_producer  # the usual call (every transactional append, every END): made already, and
        if p is not None and (not self._follows or time.monotonic() - self._checked_at < 1.0):  # no look due
            return p
        with self._lock:
            self._refresh()
            if self._tx_producer is None:
                self._tx_producer = TransactionProducer(
                    self.namesrv, self.options["PRODUCER_GROUP"], checker,
                    send_timeout_ms=self.options["SEND_TIMEOUT_MS"], **self._credentials()).start()
            return self._tx_producer

    def queue_ids(self, topic: str) -> list[int]:
        """The readable queues of `topic`; none for a topic nobody wrote to yet."""
        try:
            return self.reader.queues(topic)
        except MQBrokerError as e:
            if e.code == ResponseCode.TOPIC_NOT_EXIST:
                return []
            raise

    def close(self) -> None:
        self._close_clients()

    def _close_clients(self) -> None:
        with self._lock:
            for client in (self._tx_producer, self._producer, self._reader, self._admin):
                if client is not None:
                    try:
                        client.shutdown()
                    except Exception:  # pragma: no cover - best effort
                        log.exception("closing a client of %r failed", self)
            self._admin = self._reader = self._producer = self._tx_producer = None
            self._namesrv = None


class StoreHandler:
    """``stores[alias]`` → the process's `EventStore` for that alias (like ``caches`` and ``connections``,
    but process-wide, see the module docstring)."""

    def __init__(self) -> None:
        self._stores: dict[str, EventStore] = {}
        self._lock = threading.Lock()

    def __getitem__(self, alias: str) -> EventStore:
        with self._lock:
            store = self._stores.get(alias)
            if store is None:
                try:
                    store = EventStore(store_settings(alias))
                except ImproperlyConfigured:
                    raise
                self._stores[alias] = store
            return store

    def __iter__(self) -> Any:
        return iter(configured_aliases())

    def all(self, initialized_only: bool = False) -> list[EventStore]:
        if initialized_only:
            with self._lock:
                return list(self._stores.values())
        return [self[alias] for alias in self]

    def close_all(self) -> None:
        with self._lock:
            stores = list(self._stores.values())
        for s in stores:
            s.close()

    def reset(self) -> None:
        with self._lock:
            self._stores.clear()


stores = StoreHandler()


def get_store(alias: str = DEFAULT_ALIAS) -> EventStore:
    return stores[alias]
