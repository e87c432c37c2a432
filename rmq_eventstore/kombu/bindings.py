"""Exchanges, bindings and queue declarations shared by every process, as a log in a system topic.

AMQP keeps exchanges and bindings in the broker. RocketMQ has no such thing, so the transport keeps them
as JSON records in one topic (`kombu_sys_bindings`, one queue), with nothing but RocketMQ's own protocol:
a declaration or binding is a SEND, reading them is a PULL from where this process stopped. Every process
replays the log from its start when it connects and catches up (one PULL answered at once when there is
nothing new) before each routing decision, so a binding made by another process is seen by the next
publish that needs it (a Celery control client binds its reply queue, then broadcasts; the worker that
answers sees the binding).

Records (`op`): `exchange` (name, type, durable, auto_delete, arguments), `exchange.delete`, `queue`
(name, arguments: `x-max-priority`, `x-message-ttl`, `x-expires`; `at`: when, epoch ms), `queue.delete`
(drops the queue's bindings too; with `unused_since` only if the queue was not declared or leased after
that time: a sweeper's delete never removes a queue someone used meanwhile), `lease` (name, at: a
consumer of an `x-expires` queue says it still uses it), `bind` and `unbind` (exchange, routing key,
pattern, queue). Replaying them in log order gives the same state in every process; the last record about
a thing wins.

Compaction: the whole state after the record at offset N-1 is written as one snapshot message to a second
topic (`kombu_sys_bindings_snapshot`) with `upto` N, by whichever process has applied max(`SNAPSHOT_EVERY`,
queues + exchanges at the last snapshot) records since the last snapshot it knows of or tried (or finds the last one older than
`SNAPSHOT_MAX_AGE`, so the snapshot outlives the store's retention): a snapshot costs the state's size, so
writing one per that many records keeps its cost per record constant, and one the broker refused (the state
past its max message size) is not tried again by the next refresh. A process starts from the newest snapshot and replays only the
records from its `upto` on, so declaring and deleting a reply queue 10,000 times leaves nothing to replay.
Two processes writing a snapshot at once is harmless: each is the exact state at its own `upto`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

Binding = tuple[str, str | None, str]  # (routing key, pattern, queue), as kombu's exchange types keep them
SNAPSHOT_EVERY = 1000  # records applied since the last snapshot before a process writes one
SNAPSHOT_MAX_AGE = 6 * 3600 * 1000  # ms: a snapshot older than this is written again (retention is 72 h)

__all__ = ["Binding", "SharedState"]


class SharedState:
    """The replayed log. `send(record_bytes)` appends a record and returns its offset; `pull(offset, wait_ms)`
    returns the records from `offset` on as `(next_offset, [bytes, ...])`, waiting up to `wait_ms` for one
    (an empty list when there is nothing new). `snapshot_send(bytes)` stores a snapshot, `snapshot_last()`
    returns the newest one (or None): see the module docstring."""

    def __init__(self, send: Callable[[bytes], int], pull: Callable[[int, int], tuple[int, list[bytes]]],
                 snapshot_send: Callable[[bytes], None] | None = None,
                 snapshot_last: Callable[[], bytes | None] | None = None) -> None:
        self._send = send
        self._pull = pull
        self._snapshot_send = snapshot_send
        self._lock = threading.Lock()
        self.replayed = 0  # records applied by this process (what a snapshot saved it from is not counted)
        self._reset()
        raw = snapshot_last() if snapshot_last is not None else None
        if raw:
            try:
                self._load_snapshot(json.loads(raw))
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                log.warning("kombu bindings: unreadable snapshot ignored, replaying the whole log (%s)", e)
                self._reset()

    def _reset(self) -> None:
        self._offset = 0
        self.exchanges: dict[str, dict[str, Any]] = {}
        # exchange -> its bindings in binding order (a dict: kombu's table order, found and removed in O(1)),
        # and queue -> the (exchange, binding) pairs naming it: a record costs what it touches, not the state
        self.tables: dict[str, dict[Binding, None]] = {}
        self._by_queue: dict[str, set[tuple[str, Binding]]] = {}
        self.queues: dict[str, dict[str, Any]] = {}
        self.used: dict[str, int] = {}  # queue -> last declare or lease (epoch ms)
        self._snapshot_upto = 0
        self._snapshot_at = 0
        self._snapshot_tried = (0, 0)  # (upto, at) of the last snapshot this process tried to write
        self._snapshot_size = 0  # queues + exchanges in the last snapshot tried or loaded

    # -- snapshots ----------------------------------------------------------------------------------------
    def _load_snapshot(self, doc: dict[str, Any]) -> None:
        self.exchanges = doc["exchanges"]
        self.tables = {ex: {(b[0], b[1], b[2]): None for b in table} for ex, table in doc["tables"].items()}
        self._by_queue = {}
        for ex, table in self.tables.items():
            for b in table:
                self._by_queue.setdefault(b[2], set()).add((ex, b))
        self.queues = doc["queues"]
        self.used = {q: int(t) for q, t in doc.get("used", {}).items()}
        self._offset = self._snapshot_upto = int(doc["upto"])
        self._snapshot_at = int(doc.get("at", 0))
        self._snapshot_size = len(self.queues) + len(self.exchanges)

    def _snapshot_doc(self) -> dict[str, Any]:
        return {"upto": self._offset, "at": int(time.time() * 1000), "exchanges": self.exchanges,
                "tables": {ex: [list(b) for b in table] for ex, table in self.tables.items()},
                "queues": self.queues, "used": self.used}

    def _maybe_snapshot(self) -> None:
        """(under the lock) Write a snapshot when enough records were applied since the last one."""
        if self._snapshot_send is None:
            return
        now = int(time.time() * 1000)
        every = max(SNAPSHOT_EVERY, self._snapshot_size)
        upto, at = max(self._snapshot_upto, self._snapshot_tried[0]), max(self._snapshot_at, self._snapshot_tried[1])
        if self._offset - upto < every and now - at <= SNAPSHOT_MAX_AGE:
            return
        if self._offset == 0:
            return  # nothing to keep
        doc = self._snapshot_doc()
        self._snapshot_tried = (doc["upto"], doc["at"])
        self._snapshot_size = len(self.queues) + len(self.exchanges)
        try:
            self._snapshot_send(json.dumps(doc, separators=(",", ":"), sort_keys=True).encode())
        except Exception as e:  # tried again after as many records; replaying a longer log is only slower
            log.warning("kombu bindings: could not write a snapshot of %d queues (%s)", len(self.queues), e)
            return
        self._snapshot_upto, self._snapshot_at = doc["upto"], doc["at"]

    # -- reading ----------------------------------------------------------------------------------------
    def refresh(self, until: int = 0, timeout: float = 10.0) -> None:
        """Apply every record appended since the last call (by any process); with `until`, first wait (up to
        `timeout`) until the record at offset `until - 1` is readable: the broker makes a record readable
        shortly after the send that stored it returns."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while True:
                wait = 0
                if self._offset < until:
                    wait = max(int((deadline - time.monotonic()) * 1000), 0)
                nxt, records = self._pull(self._offset, wait)
                for raw in records:
                    try:
                        self._apply(json.loads(raw))
                    except (ValueError, KeyError, TypeError) as e:
                        log.warning("kombu bindings: unreadable record skipped (%s)", e)
                self.replayed += len(records)
                if records or nxt > self._offset:
                    self._offset = nxt
                if self._offset >= until and not records:
                    self._maybe_snapshot()
                    return
                if not records and time.monotonic() >= deadline:
                    log.warning("kombu bindings: record %d not readable after %.0f s", until - 1, timeout)
                    return

    def _apply(self, rec: dict[str, Any]) -> None:
        op = rec["op"]
        if op == "exchange":
            self.exchanges[rec["name"]] = {"type": rec["type"], "durable": rec.get("durable", True),
                                           "auto_delete": rec.get("auto_delete", False),
                                           "arguments": rec.get("arguments") or {}}
        elif op == "exchange.delete":
            self.exchanges.pop(rec["name"], None)
            for b in self.tables.pop(rec["name"], {}):
                self._unindex(rec["name"], b)
        elif op == "queue":
            q = rec["name"]
            self.queues[q] = rec.get("arguments") or {}
            self.used[q] = max(self.used.get(q, 0), int(rec.get("at", 0)))
        elif op == "lease":
            q = rec["name"]
            if q in self.queues:
                self.used[q] = max(self.used.get(q, 0), int(rec["at"]))
        elif op == "queue.delete":
            q = rec["name"]
            since = rec.get("unused_since")
            if since is not None and self.used.get(q, 0) > int(since):
                return  # used again after the sweeper looked: the delete is void
            self.queues.pop(q, None)
            self.used.pop(q, None)
            for ex, b in self._by_queue.pop(q, ()):
                table = self.tables.get(ex)
                if table is not None:
                    table.pop(b, None)
                    if not table:
                        del self.tables[ex]
        elif op in ("bind", "unbind"):
            b: Binding = (rec["routing_key"], rec.get("pattern"), rec["queue"])
            ex = rec["exchange"]
            table = self.tables.setdefault(ex, {})
            if op == "bind" and b not in table:
                table[b] = None
                self._by_queue.setdefault(b[2], set()).add((ex, b))
            elif op == "unbind" and b in table:
                del table[b]
                self._unindex(ex, b)
        else:
            log.debug("kombu bindings: unknown record %r ignored", op)

    def _unindex(self, exchange: str, b: Binding) -> None:
        pairs = self._by_queue.get(b[2])
        if pairs is not None:
            pairs.discard((exchange, b))
            if not pairs:
                del self._by_queue[b[2]]

    def _bound(self, exchange: str, b: Binding) -> bool:
        """Whether `b` is in `exchange`'s table, after catching up with the log."""
        self.refresh()
        with self._lock:
            return b in self.tables.get(exchange, ())

    def table(self, exchange: str) -> list[Binding]:
        """The bindings of `exchange` (a copy), after catching up with the log."""
        self.refresh()
        with self._lock:
            return list(self.tables.get(exchange, ()))

    def exchange(self, name: str, refresh: bool = True) -> dict[str, Any] | None:
        if refresh:
            self.refresh()
        with self._lock:
            return self.exchanges.get(name)

    def expired(self, now_ms: int) -> list[tuple[str, int]]:
        """(queue, last use) of the queues declared with `x-expires` and unused for longer than that."""
        self.refresh()
        with self._lock:
            out = []
            for q, args in self.queues.items():
                ttl = args.get("x-expires")
                if ttl and self.used.get(q, 0) + int(ttl) < now_ms:
                    out.append((q, self.used.get(q, 0)))
            return out

    def queue(self, name: str, refresh: bool = True) -> dict[str, Any] | None:
        """The arguments the queue was declared with, or None for a queue not declared (or deleted)."""
        if refresh:
            self.refresh()
        with self._lock:
            return self.queues.get(name)

    # -- writing ----------------------------------------------------------------------------------------
    def append(self, record: dict[str, Any], wait: bool = True) -> None:
        """Append a record and catch up, so this process sees it (and what came before it) at once
        (`wait=False`: do not wait for it, a lease)."""
        offset = self._send(json.dumps(record, separators=(",", ":"), sort_keys=True).encode())
        if wait:
            self.refresh(until=offset + 1)

    def declare_exchange(self, name: str, type: str, durable: bool, auto_delete: bool,
                         arguments: dict[str, Any] | None) -> None:
        want = {"type": type, "durable": durable, "auto_delete": auto_delete, "arguments": arguments or {}}
        if self.exchange(name) != want:
            self.append({"op": "exchange", "name": name, **want})

    def delete_exchange(self, name: str) -> None:
        self.append({"op": "exchange.delete", "name": name})

    def declare_queue(self, name: str, arguments: dict[str, Any]) -> None:
        """Declare (a declaration of an `x-expires` queue is a use: it is recorded again once a third of
        its expiry has passed since the last use)."""
        now = int(time.time() * 1000)
        ttl = arguments.get("x-expires")
        if self.queue(name) != arguments or (ttl and now - self.used.get(name, 0) > int(ttl) // 3):
            self.append({"op": "queue", "name": name, "arguments": arguments, "at": now})

    def lease(self, name: str) -> None:
        """Say that `name` is in use now (a consumer of an `x-expires` queue, every third of its expiry)."""
        self.append({"op": "lease", "name": name, "at": int(time.time() * 1000)}, wait=False)

    def delete_queue(self, name: str, unused_since: int | None = None) -> bool:
        """Delete the queue's declaration and bindings; with `unused_since` (a sweeper) only if nobody
        declared or leased it after that time. Returns whether it is gone."""
        rec: dict[str, Any] = {"op": "queue.delete", "name": name}
        if unused_since is not None:
            rec["unused_since"] = unused_since
        self.append(rec)
        return self.queue(name, refresh=False) is None

    def bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        if not self._bound(exchange, (routing_key, pattern, queue)):
            self.append({"op": "bind", "exchange": exchange, "routing_key": routing_key, "pattern": pattern,
                         "queue": queue})

    def unbind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        if self._bound(exchange, (routing_key, pattern, queue)):
            self.append({"op": "unbind", "exchange": exchange, "routing_key": routing_key, "pattern": pattern,
                         "queue": queue})
