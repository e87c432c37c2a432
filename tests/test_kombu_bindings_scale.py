"""The kombu transport's shared bindings cost per record what the record touches, not the whole state: a
`queue.delete` (a reply queue going, an `x-expires` sweep) took the queue's bindings out of every exchange's
table by rebuilding all of them (10,000 queues: 15.6 ms a delete, in every process that replays the log, under
the lock every publish takes), and a `bind` looked its binding up in a copy of the exchange's whole table.

The log here is an in-memory list behind `SharedState`'s own send/pull contract (what the transport wires to a
topic of the broker; tests/test_kombu_expiry.py runs it on a real one). With 10,000 queues the old code takes
minutes; the state must match the rule written plainly, and a process starting from a snapshot must agree."""

from __future__ import annotations

import json

from rmq_eventstore.kombu.bindings import SharedState


class MemoryLog:
    """The bindings topic and its snapshot topic, in memory."""

    def __init__(self) -> None:
        self.records: list[bytes] = []
        self.snapshots: list[bytes] = []

    def send(self, raw: bytes) -> int:
        self.records.append(raw)
        return len(self.records) - 1

    def pull(self, offset: int, wait_ms: int) -> tuple[int, list[bytes]]:
        batch = self.records[offset:offset + 1000]  # a pull answers at most so many
        return offset + len(batch), batch

    def state(self) -> SharedState:
        return SharedState(self.send, self.pull, self.snapshots.append,
                           lambda: self.snapshots[-1] if self.snapshots else None)


def test_many_queues_bound_declared_and_deleted() -> None:
    log = MemoryLog()
    s = log.state()
    n = 10_000
    s.declare_exchange("reply.celery.pidbox", "direct", False, False, None)
    for i in range(n):
        q = f"q{i}"
        s.declare_queue(q, {})
        s.bind(q, q, None, q)  # each queue bound to its own exchange (Celery's default queues) ...
        s.bind("reply.celery.pidbox", q, None, q)  # ... and to one shared exchange
    s.bind("reply.celery.pidbox", "q5", None, "q5")  # bound already: no record
    assert len(log.records) == 1 + 3 * n
    for i in range(0, n, 2):
        assert s.delete_queue(f"q{i}")
    s.unbind("reply.celery.pidbox", "q1", None, "q1")
    s.bind("reply.celery.pidbox", "q1", None, "q1")  # bound again: last in the table
    left = [f"q{i}" for i in range(3, n, 2)] + ["q1"]
    assert [b[2] for b in s.table("reply.celery.pidbox")] == left
    assert s.table("q2") == [] and s.table("q3") == [("q3", None, "q3")]
    assert s.queue("q2") is None and s.queue("q3") == {}
    s.delete_exchange("reply.celery.pidbox")
    assert s.table("reply.celery.pidbox") == []
    assert s.delete_queue("q3") and s.table("q3") == []
    # another process: from the newest snapshot (one every 1,000 records) and the records after it
    other = log.state()
    other.refresh()
    assert log.snapshots and other.replayed < len(log.records) / 2
    for name in ("q1", "q3", "q4", "q7", f"q{n - 1}"):
        assert other.table(name) == s.table(name) and other.queue(name) == s.queue(name)
    assert other.table("reply.celery.pidbox") == []
    # the snapshot is written as before: every exchange's bindings as lists, in table order
    doc = json.loads(log.snapshots[-1])
    assert doc["tables"]["q7"] == [["q7", None, "q7"]]


def test_a_snapshot_is_written_at_most_once_per_state_size_of_records() -> None:
    """A snapshot is the whole state: one every 1,000 records cost O(state) per 1,000 records, and one the broker
    refuses (past its max message size, 4 MiB: ~12,000 queues) was tried again by every refresh, i.e. every
    publish encoded the whole state. Now a snapshot, written or refused, waits for max(1,000, queues +
    exchanges) more records."""
    log = MemoryLog()
    limit = 64 * 1024  # the broker's max message size, small here
    tried: list[int] = []

    def send_snapshot(raw: bytes) -> None:
        tried.append(len(raw))
        if len(raw) > limit:
            raise ValueError(f"MESSAGE_ILLEGAL: the message body size {len(raw)} is over {limit}")
        log.snapshots.append(raw)

    s = SharedState(log.send, log.pull, send_snapshot, lambda: log.snapshots[-1] if log.snapshots else None)
    n = 3000
    for i in range(n):
        s.declare_queue(f"queue-with-a-celery-sized-name-{i}", {})  # past the limit after ~1,000
    refused = len([t for t in tried if t > limit])
    assert 1 <= refused <= 2, tried  # was one per refresh after the first refused one (1,900 here)
    assert len(tried) <= 3, tried
    for _ in range(500):  # publishes: each refreshes; nothing new, nothing to write
        s.table("x")
    assert len(tried) <= 3
    # a process starting now replays from the last snapshot written (or the start): the same state
    other = log.state()
    other.refresh()
    assert other.queues == s.queues and other.used == s.used
