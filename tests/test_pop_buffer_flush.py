"""`PopBufferMergeService.flush_due`: which buffered checkpoints a revive round stores, against the rule in
pop_buffer.py's docstring (every checkpoint up to a queue's last one due, in pop order; nothing after it), with
pops whose bounds come in order, out of order (two consumers of a queue with different invisible times) and many
never acked; the store is the buffer's own callbacks, recorded."""

from __future__ import annotations

import random

import pytest

from rmq_eventstore.broker.pop_buffer import PopBufferMergeService
from rmq_eventstore.common.pop import PopCheckPoint

T0 = 1_700_000_000_000


class Recorder:
    """The buffer's `put_ck` / `commit` / `committed`: what was stored, and the consume offsets."""

    def __init__(self) -> None:
        self.stored: list[tuple[int, int]] = []  # (start offset, pop time), in write order
        self.offsets: dict[tuple[str, str, int], int] = {}
        self.buffer = PopBufferMergeService(self.put_ck, self.commit, self.committed, stay_ms=10_000, margin_ms=500)

    def put_ck(self, ck: PopCheckPoint, revive_qid: int) -> bool:
        self.stored.append((ck.start_offset, ck.pop_time))
        return True

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.offsets[(group, topic, queue_id)] = offset

    def committed(self, group: str, topic: str, queue_id: int) -> int:
        return self.offsets.get((group, topic, queue_id), 0)

    def pop(self, offset: int, pop_time: int, invisible_time: int, queue_id: int = 0) -> None:
        ck = PopCheckPoint(start_offset=offset, pop_time=pop_time, invisible_time=invisible_time, num=1,
                           queue_id=queue_id, topic="jobs", group="g", broker_name="b", queue_offset_diff=[0])
        assert self.buffer.add_ck(ck, 0, offset + 1)


def bound(pop_time: int, invisible_time: int) -> int:
    """When a pop's checkpoint is due: after the stay, or the margin before its revive time."""
    return pop_time + max(min(10_000, invisible_time - 500), 0)


def expected(pops: list[tuple[int, int, int]], now: int) -> list[tuple[int, int]]:
    """The rule, written plainly: every pop of the queue up to its last one due."""
    due = [i for i, (_, pt, it) in enumerate(pops) if bound(pt, it) <= now]
    return [(o, pt) for o, pt, _ in pops[: due[-1] + 1]] if due else []


def test_pops_due_in_order_are_stored_up_to_the_last_one_due() -> None:
    r = Recorder()
    pops = [(i, T0 + i, 60_000) for i in range(100)]
    for p in pops:
        r.pop(*p)
    assert r.buffer.flush_due(T0 + 10_000 - 1) == 0 and r.stored == []
    assert r.buffer.flush_due(T0 + 10_041) == 42
    assert r.stored == expected(pops, T0 + 10_041)
    assert r.offsets[("g", "jobs", 0)] == 42 and r.buffer.size() == 58
    assert r.buffer.flush_due(T0 + 10_041) == 0  # nothing twice
    assert r.buffer.flush_due(T0 + 20_000) == 58 and r.stored == expected(pops, T0 + 20_000) and r.buffer.size() == 0


def test_a_later_pop_due_first_takes_every_earlier_pop_of_its_queue_with_it() -> None:
    # a second consumer of the queue pops with a 2 s invisible time: its checkpoint is due 1.5 s after its pop,
    # before the first consumer's earlier ones (10 s); a checkpoint may only be stored after the queue's earlier
    # ones (recovery moves the offset to the end of the checkpoints it finds)
    r = Recorder()
    pops = [(0, T0, 60_000), (1, T0 + 1, 60_000), (2, T0 + 2, 2_000), (3, T0 + 3, 60_000)]
    for p in pops:
        r.pop(*p)
    assert r.buffer.flush_due(T0 + 1_502) == 3
    assert r.stored == [(0, T0), (1, T0 + 1), (2, T0 + 2)] == expected(pops, T0 + 1_502)
    assert r.offsets[("g", "jobs", 0)] == 3 and r.buffer.size() == 1


def test_an_acked_pop_before_the_last_one_due_is_not_stored() -> None:
    r = Recorder()
    pops = [(i, T0 + i, 60_000) for i in range(5)]
    for p in pops:
        r.pop(*p)
    assert r.buffer.ack_one(("g", "jobs", 0, 2, T0 + 2), 2, 3)
    assert r.buffer.flush_due(T0 + 10_003) == 3
    assert r.stored == [(0, T0), (1, T0 + 1), (3, T0 + 3)]
    assert r.offsets[("g", "jobs", 0)] == 4


@pytest.mark.parametrize("seed", range(5))
def test_many_never_acked_pops_with_mixed_invisible_times(seed: int) -> None:
    # 5,000 pops over 7.5 s that nobody acks, a fifth of them with a short invisible time, flushed by rounds of
    # 100 ms: after each round, exactly what the rule names is stored, in pop order, once
    rng = random.Random(seed)
    r = Recorder()
    pops: list[tuple[int, int, int]] = []
    flushed = 0
    now = T0
    for i in range(5_000):
        pt = T0 + i * 3 // 2
        while now + 100 <= pt:  # the revive rounds between pops
            now += 100
            r.buffer.flush_due(now)
            flushed = max(flushed, len(expected(pops, now)))
            assert len(r.stored) == flushed and r.stored[-1:] == [(o, p) for o, p, _ in pops[flushed - 1:flushed]]
        it = rng.choice((60_000, 60_000, 60_000, 60_000, rng.randrange(600, 12_000)))
        pops.append((i, pt, it))
        r.pop(i, pt, it)
    assert flushed > 0 and r.stored == [(o, p) for o, p, _ in pops[:flushed]]
    r.buffer.flush_due(now + 60_000)
    assert r.stored == [(o, p) for o, p, _ in pops] and r.buffer.size() == 0
    assert r.offsets[("g", "jobs", 0)] == 5_000


def test_a_journal_whose_live_entries_outgrow_its_bound_is_not_rewritten_every_round(tmp_path) -> None:
    # never-acked pops whose live lines alone pass the journal's bound: the rewrite leaves a journal over the
    # bound, which must not make every later round rewrite it again (O(live) under the buffer's lock each 100 ms)
    from rmq_eventstore.broker.pop_buffer import PopJournal

    path = tmp_path / "ckbuffer.journal"
    r = Recorder()
    journal = r.buffer.journal = PopJournal(str(path), max_bytes=4096)
    rewrites: list[int] = []
    rewrite = journal.reset
    journal.reset = lambda live, offsets: (rewrites.append(len(live)), rewrite(live, offsets))  # type: ignore
    for i in range(200):  # ~60 bytes a C line: 12 KB live
        r.pop(i, T0 + i, 60_000)
    r.buffer.flush_due(T0)  # nothing due; the journal is past its bound: rewritten once
    assert rewrites == [200] and path.stat().st_size > 4096
    for k in range(1, 20):  # rounds with nothing new: no rewrite
        r.buffer.flush_due(T0 + k * 100)
    assert rewrites == [200]
    for i in range(200, 600):  # the journal doubles past what the rewrite left: rewritten again, once
        r.pop(i, T0 + 2_000 + i, 60_000)
    r.buffer.flush_due(T0 + 2_000)
    r.buffer.flush_due(T0 + 2_100)
    assert rewrites == [200, 600]
    # what a restart reads back is every live pop, once
    cks, _ = PopJournal.recover(str(path), "b")
    assert sorted(c[0].start_offset for c in cks) == list(range(600))
