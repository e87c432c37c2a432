"""Expected-version appends: optimistic concurrency per stream, our extension to RocketMQ's protocol.

A stream is (topic, stream id); its events are numbered 1, 2, 3, ... Each stored event carries
`STREAM_ID` and `STREAM_VERSION` properties and the stream id among its KEYS, so the index finds a stream's
events and the numbers can always be re-derived from the store: there is no side file to drift.

The check and the append happen under one lock per stream (striped), so of concurrent appends at the same
expected version exactly one wins; a batch is one append, all or nothing. The latest version of a stream
is kept in a bounded LRU cache filled at every append; a stream not in the cache is looked up in the index
once the dispatcher has indexed everything written so far (the newest indexed event of the stream carries
its latest version). A half message (transactions) reserves its versions until its end: while one is
pending the stream takes no other append, so a rollback never leaves a hole in the numbering. Pending
reservations are rebuilt from the half queue when the broker starts.
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..common import Message, MessageExt
from ..common.properties import (
    KEY_SEPARATOR,
    PROPERTY_KEYS,
    PROPERTY_REAL_TOPIC,
    PROPERTY_STREAM_ID,
    PROPERTY_STREAM_TX_GROUP,
    PROPERTY_STREAM_VERSION,
    get_property,
    set_property,
)
from ..store import MessageStore

if TYPE_CHECKING:
    from .transaction import TransactionalMessageService

CACHE_LIMIT = 200_000  # streams whose latest version is kept in memory
LOCK_STRIPES = 256
INDEX_PROBES = (64, 1024, 16_384)  # how many of a key's newest index entries are read to find the stream's


@dataclass(frozen=True)
class Conflict:
    """Why an append was refused: the stream's current version, and a reserved one while a transaction is open."""

    stream: str
    expected: int | None
    current: int
    pending: str | None = None

    def message(self) -> str:
        if self.pending is not None:
            return (f"stream {self.stream!r} has a pending transaction {self.pending} holding version "
                    f"{self.current}; append after it ends")
        return f"wrong expected version for stream {self.stream!r}: expected {self.expected}, current {self.current}"


class StreamVersionManager:
    """Latest versions per stream and the locks that make check-and-append atomic (see the module docstring)."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self._locks = [threading.Lock() for _ in range(LOCK_STRIPES)]
        self._cache_lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], int] = OrderedDict()
        # stream -> [(transaction id, reserved version, transaction group)], oldest first; more than one only for
        # half messages of one transaction group (one database transaction), which end together
        self._pending: dict[tuple[str, str], list[tuple[str, int, str | None]]] = {}

    def forget_topic(self, topic: str) -> None:
        """`topic` was deleted: its cached versions no longer hold (a topic created again starts anew)."""
        with self._cache_lock:
            for key in [k for k in self._cache if k[0] == topic]:
                del self._cache[key]

    def lock_for(self, topic: str, stream: str) -> threading.Lock:
        return self._locks[self._stripe(topic, stream)]

    @staticmethod
    def _stripe(topic: str, stream: str) -> int:
        return zlib.crc32(f"{topic}\x00{stream}".encode()) % LOCK_STRIPES

    def locks_for(self, topic: str, streams: list[str]) -> list[threading.Lock]:
        """The locks of several streams, each once, in stripe order: acquired in this order by every
        multi-stream append, so two of them never wait for each other."""
        return [self._locks[i] for i in sorted({self._stripe(topic, s) for s in streams})]

    # -- versions ---------------------------------------------------------------------------------------
    def current(self, topic: str, stream: str) -> int:
        """The stream's latest committed version (0: no event yet). Call with the stream's lock held."""
        key = (topic, stream)
        with self._cache_lock:
            v = self._cache.get(key)
            if v is not None:
                self._cache.move_to_end(key)
                return v
        v = self._from_index(topic, stream)
        self._set(key, v)
        return v

    def cached(self, topic: str, stream: str) -> int | None:
        """The stream's latest committed version if it is in the cache (no index read, no lock of the
        stream: a hint, e.g. of how long a read of the stream will be), else None."""
        with self._cache_lock:
            return self._cache.get((topic, stream))

    def _set(self, key: tuple[str, str], version: int) -> None:
        with self._cache_lock:
            self._cache[key] = version
            self._cache.move_to_end(key)
            while len(self._cache) > CACHE_LIMIT:
                self._cache.popitem(last=False)

    def _from_index(self, topic: str, stream: str) -> int:
        self.store.wait_for_dispatch(30.0)  # everything written so far is indexed
        for probe in INDEX_PROBES:
            r = self.store.query_message(topic, stream, probe, batch_limit=probe)
            versions = [int(m.properties[PROPERTY_STREAM_VERSION]) for m in r.messages
                        if m.properties.get(PROPERTY_STREAM_ID) == stream
                        and m.properties.get(PROPERTY_STREAM_VERSION, "").isdigit()]
            if versions:
                return max(versions)
            if len(r.messages) < probe:
                break  # every entry of the key was read
        return 0

    def check(self, topic: str, stream: str, expected: int | None, count: int,
              group: str | None = None) -> tuple[int, Conflict | None]:
        """(first version to assign, None) or (0, the conflict). Call with the stream's lock held. A half
        message of transaction `group` may follow the pending ones of the same group: it takes the version
        after theirs, and `expected` is compared with the last of them."""
        pending = self._pending.get((topic, stream))
        current = self.current(topic, stream)
        if pending:
            last_txid, last_version, _ = pending[-1]
            if group is None or any(g != group for _, _, g in pending):
                return 0, Conflict(stream, expected, last_version, last_txid)
            if expected is not None and expected != last_version:
                return 0, Conflict(stream, expected, last_version)
            return last_version + 1, None
        if expected is not None and expected != current:
            return 0, Conflict(stream, expected, current)
        return current + 1, None

    @staticmethod
    def stamp(msgs: list[Message], stream: str, first: int) -> None:
        """Give `msgs` their stream id and versions (properties, and the stream id among the KEYS)."""
        for i, m in enumerate(msgs):
            props = m.properties_string or ""
            keys = get_property(props, PROPERTY_KEYS)
            if keys is None:
                props = set_property(props, PROPERTY_KEYS, stream)
            elif stream not in keys.split(KEY_SEPARATOR):
                props = set_property(props, PROPERTY_KEYS, f"{keys}{KEY_SEPARATOR}{stream}")
            props = set_property(props, PROPERTY_STREAM_ID, stream)
            m.properties_string = set_property(props, PROPERTY_STREAM_VERSION, str(first + i))

    def appended(self, topic: str, stream: str, last: int) -> None:
        """An append of `stream` up to version `last` is stored. Call with the stream's lock held."""
        self._set((topic, stream), last)

    # -- transactions -------------------------------------------------------------------------------------
    def reserve(self, topic: str, stream: str, txid: str, version: int, group: str | None = None) -> None:
        """A half message holds `version` of the stream until its end. Call with the stream's lock held."""
        self._pending.setdefault((topic, stream), []).append((txid, version, group))

    def release(self, half: MessageExt, committed: bool) -> None:
        """The transaction of `half` ended: its reservation goes, and a commit makes its version current."""
        props = half.properties
        stream = props.get(PROPERTY_STREAM_ID)
        if not stream:
            return
        topic = props.get(PROPERTY_REAL_TOPIC, half.topic)
        key = (topic, stream)
        txid = half.uniq_key or ""
        with self.lock_for(topic, stream):
            pending = self._pending.get(key) or []
            mine = [p for p in pending if p[0] == txid]
            if not mine:
                return
            rest = [p for p in pending if p[0] != txid]
            if rest:
                self._pending[key] = rest
            else:
                del self._pending[key]
            if committed:
                with self._cache_lock:
                    known = self._cache.get(key, 0)
                self._set(key, max(known, mine[0][1]))

    def rebuild_reservations(self, transactions: TransactionalMessageService, halves: list[MessageExt]) -> int:
        """Reserve again the versions of open stream transactions among `halves` (broker start)."""
        n = 0
        for half in halves:
            props = half.properties
            stream, version = props.get(PROPERTY_STREAM_ID), props.get(PROPERTY_STREAM_VERSION, "")
            if not stream or not version.isdigit() or transactions.outcome(half) is not None:
                continue
            topic = props.get(PROPERTY_REAL_TOPIC, "")
            with self.lock_for(topic, stream):
                self.reserve(topic, stream, half.uniq_key or "", int(version), props.get(PROPERTY_STREAM_TX_GROUP))
            n += 1
        return n

    def pending_count(self) -> int:
        """Versions reserved by open transactions."""
        return sum(len(v) for v in self._pending.values())

    def read_last(self, topic: str, stream: str, count: int) -> list[MessageExt]:
        """The stream's newest `count` events, in order, reading only the newest index entries of its key
        (the chain walk goes newest first): what a "latest event" lookup needs, at a cost that does not
        grow with the stream's length."""
        probe = count + 8  # a few more for hash collisions with other keys; grown when they took too many
        while True:
            r = self.store.query_message(topic, stream, probe, batch_limit=probe)
            events = [m for m in r.messages if m.properties.get(PROPERTY_STREAM_ID) == stream
                      and m.properties.get(PROPERTY_STREAM_VERSION, "").isdigit()]
            if len(events) >= count or len(r.messages) < probe or probe >= 1 << 20:
                events.sort(key=lambda m: int(m.properties[PROPERTY_STREAM_VERSION]))
                return events[-count:]
            probe *= 16  # hash collisions of other keys took some of the entries read

    def read(self, topic: str, stream: str, from_version: int = 1, max_events: int = 100_000) -> list[MessageExt]:
        """The stream's events from `from_version` on, in order (one index query and a sort)."""
        r = self.store.query_message(topic, stream, max_events, batch_limit=max_events)
        events = [m for m in r.messages if m.properties.get(PROPERTY_STREAM_ID) == stream
                  and m.properties.get(PROPERTY_STREAM_VERSION, "").isdigit()
                  and int(m.properties[PROPERTY_STREAM_VERSION]) >= from_version]
        events.sort(key=lambda m: int(m.properties[PROPERTY_STREAM_VERSION]))
        return events
