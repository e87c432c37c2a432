"""The revive round takes exactly the checkpoints that are due, whatever their order in the revive topic: pops of
one queue with invisible times out of pop order (their revive times are not in record order), some acked after
their checkpoint was stored (ack records), revived at chosen instants by `PopService.revive_once(now)` on a real
broker (checkpoint buffer off, so every pop writes its checkpoint): what reaches the pop retry topic, what stays
pending and where the revive offset stands, against the rule written plainly."""

from __future__ import annotations

from pathlib import Path

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.pop_service import REVIVE_GROUP
from rmq_eventstore.client import Message, PopConsumer, Producer
from rmq_eventstore.common.pop import REVIVE_QUEUE_NUM, ExtraInfo, pop_retry_topic

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


def retried(rb, topic: str) -> list:  # noqa: ANN001 - a RunningBroker
    """Every message of the pop retry topic (a read returns at most 32)."""
    out: list = []
    while (r := rb.store.get_message("reader", topic, 0, len(out), 32, None)) is not None and r.messages:
        out += r.messages
    return out


def test_a_round_revives_what_is_due_and_nothing_else(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "store", enable_pop_buffer_merge=False, **SMALL) as rb:
        ns = rb.namesrv_address
        n = 60
        with Producer(ns, "p") as p:
            for i in range(n):
                p.send(Message("jobs", f"m{i}".encode(), keys=f"m{i}"), queue_id=0)
        rb.store.wait_for_dispatch()
        revive_at: dict[str, int] = {}
        with PopConsumer(ns, "g") as c:
            for i in range(n):
                it = 600_000 + (i * 37 % 60) * 1000  # 600-659 s, out of pop order
                (m,) = c.pop("jobs", max_nums=1, invisible_time=it, queue_id=0)
                extra = ExtraInfo.split(m.properties["POP_CK"])
                assert m.keys == f"m{i}"
                if i % 3 == 0:
                    c.ack(m)  # its checkpoint is already in the revive topic: an ack record
                else:
                    revive_at[f"m{i}"] = extra.pop_time + extra.invisible_time
        rb.store.wait_for_dispatch()
        ps = rb.broker.pop_service
        retry = pop_retry_topic("g", "jobs")
        start = min(revive_at.values()) - 1
        for now in [start, *range(start + 5_000, start + 70_000, 5_000)]:
            ps.revive_once(now)
            rb.store.wait_for_dispatch()
            back = sorted(m.keys for m in retried(rb, retry))
            want = sorted(k for k, at in revive_at.items() if at <= now)
            assert back == want, (now, [(k, revive_at[k] - now) for k in set(want) ^ set(back)])
            assert ps.pending_count() == sum(at > now for at in revive_at.values())
        assert len(back) == len(revive_at) == 40
        # every checkpoint is settled: the revive offset of each revive queue is past all its records
        for q in range(REVIVE_QUEUE_NUM):
            end = rb.store.get_max_offset_in_queue(ps.revive_topic, q)
            at = rb.broker.offset_manager.file.query_offset(REVIVE_GROUP, ps.revive_topic, q)
            assert at == end if end > 0 else at in (0, -1), (q, at, end)
