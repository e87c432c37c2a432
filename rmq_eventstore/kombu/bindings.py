"""Exchanges, bindings and queue declarations shared by every process, as a log in a system topic.

AMQP keeps exchanges and bindings in the broker. RocketMQ has no such thing, so the transport keeps them
as JSON records in one topic (`kombu_sys_bindings`, one queue), with nothing but RocketMQ's own protocol:
a declaration or binding is a SEND, reading them is a PULL from where this process stopped. Every process
replays the log from its start when it connects and catches up (one PULL answered at once when there is
nothing new) before each routing decision, so a binding made by another process is seen by the next
publish that needs it (a Celery control client binds its reply queue, then broadcasts; the worker that
answers sees the binding).

Records (`op`): `exchange` (name, type, durable, auto_delete, arguments), `exchange.delete`, `queue`
(name, arguments: `x-max-priority`, `x-message-ttl`, `x-expires`), `queue.delete` (drops the queue's
bindings too), `bind` and `unbind` (exchange, routing key, pattern, queue). Replaying them in log order
gives the same state in every process; the last record about a thing wins.
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

__all__ = ["Binding", "SharedState"]


class SharedState:
    """The replayed log. `send(record_bytes)` appends a record and returns its offset; `pull(offset, wait_ms)`
    returns the records from `offset` on as `(next_offset, [bytes, ...])`, waiting up to `wait_ms` for one
    (an empty list when there is nothing new)."""

    def __init__(self, send: Callable[[bytes], int], pull: Callable[[int, int], tuple[int, list[bytes]]]) -> None:
        self._send = send
        self._pull = pull
        self._lock = threading.Lock()
        self._offset = 0
        self.exchanges: dict[str, dict[str, Any]] = {}
        self.tables: dict[str, list[Binding]] = {}
        self.queues: dict[str, dict[str, Any]] = {}

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
                if records or nxt > self._offset:
                    self._offset = nxt
                if self._offset >= until and not records:
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
            self.tables.pop(rec["name"], None)
        elif op == "queue":
            self.queues[rec["name"]] = rec.get("arguments") or {}
        elif op == "queue.delete":
            q = rec["name"]
            self.queues.pop(q, None)
            for ex, table in list(self.tables.items()):
                table[:] = [b for b in table if b[2] != q]
                if not table:
                    del self.tables[ex]
        elif op in ("bind", "unbind"):
            b: Binding = (rec["routing_key"], rec.get("pattern"), rec["queue"])
            table = self.tables.setdefault(rec["exchange"], [])
            if op == "bind" and b not in table:
                table.append(b)
            elif op == "unbind" and b in table:
                table.remove(b)
        else:
            log.debug("kombu bindings: unknown record %r ignored", op)

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

    def queue(self, name: str, refresh: bool = True) -> dict[str, Any] | None:
        """The arguments the queue was declared with, or None for a queue not declared (or deleted)."""
        if refresh:
            self.refresh()
        with self._lock:
            return self.queues.get(name)

    # -- writing ----------------------------------------------------------------------------------------
    def append(self, record: dict[str, Any]) -> None:
        """Append a record and catch up, so this process sees it (and what came before it) at once."""
        offset = self._send(json.dumps(record, separators=(",", ":"), sort_keys=True).encode())
        self.refresh(until=offset + 1)

    def declare_exchange(self, name: str, type: str, durable: bool, auto_delete: bool,
                         arguments: dict[str, Any] | None) -> None:
        want = {"type": type, "durable": durable, "auto_delete": auto_delete, "arguments": arguments or {}}
        if self.exchange(name) != want:
            self.append({"op": "exchange", "name": name, **want})

    def delete_exchange(self, name: str) -> None:
        self.append({"op": "exchange.delete", "name": name})

    def declare_queue(self, name: str, arguments: dict[str, Any]) -> None:
        if self.queue(name) != arguments:
            self.append({"op": "queue", "name": name, "arguments": arguments})

    def delete_queue(self, name: str) -> None:
        self.append({"op": "queue.delete", "name": name})

    def bind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        if (routing_key, pattern, queue) not in self.table(exchange):
            self.append({"op": "bind", "exchange": exchange, "routing_key": routing_key, "pattern": pattern,
                         "queue": queue})

    def unbind(self, exchange: str, routing_key: str, pattern: str | None, queue: str) -> None:
        if (routing_key, pattern, queue) in self.table(exchange):
            self.append({"op": "unbind", "exchange": exchange, "routing_key": routing_key, "pattern": pattern,
                         "queue": queue})
