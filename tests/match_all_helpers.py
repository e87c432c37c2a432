"""What the match-all read's tests share (tests/test_message_store_read_runs.py: `_get_matching_all`
against the unit loop, and tests/test_pull_native.py: `_native.read_runs` against both): a queue filled
with records of several sizes, the reads of one list of units side by side, and the crafted units and
transfer limits their property tests draw."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from rmq_eventstore.store import GetMessageResult, GetMessageStatus, Message, MessageStore
from rmq_eventstore.store.consume_queue import UNIT
from rmq_eventstore.store.message_store import BLANK_UNIT_SIZE

COMMITLOG_FILE_SIZE = 64 * 1024  # tests/conftest.py's SMALL_GEOMETRY
TOPIC = "T"


def fill(store: MessageStore, n: int) -> None:
    """n records (keys k0.., three tags, 100 to 396 body bytes) into queue 0 of TOPIC, ten a batch, dispatched."""
    for i in range(0, n, 10):
        store.put_messages([Message(topic=TOPIC, body=bytes([j % 251]) * (100 + 37 * (j % 9)), tags=f"t{j % 3}",
                                    keys=f"k{j}", queue_id=0) for j in range(i, i + 10)])
    assert store.wait_for_dispatch()


def match_all_reads(store: MessageStore, units: list[tuple[int, int, int]], offset: int, max_nums: int,
                    max_total: int, native: object = None) -> tuple[GetMessageResult | None, ...]:
    """The reads of `units` (starting at queue offset `offset`) on the store's current bounds, each into a
    fresh result: `_get_matching_all_native` with `native` first when it is given (None where it declines),
    then `_get_matching_all` and the general unit loop `_get_by_units`."""
    max_phy = store.commit_log.get_max_offset()
    min_phy = store.commit_log.get_min_offset()

    def fresh() -> GetMessageResult:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, offset, 0, 999)

    out: list[GetMessageResult | None] = []
    if native is not None:
        raw = b"".join(UNIT.pack(*u) for u in units)
        out.append(store._get_matching_all_native(fresh(), raw, offset, max_nums, max_total, max_phy, min_phy,
                                                  impl=native))
    out.append(store._get_matching_all(fresh(), units, offset, max_nums, max_total, max_phy, min_phy))
    out.append(store._get_by_units(fresh(), units, offset, max_nums, max_total, max_phy, min_phy, None))
    return tuple(out)


def draw_crafted_read(data: st.DataObject, store: MessageStore, ratios: Sequence[int],
                      more_units: Sequence[st.SearchStrategy] = ()) -> tuple[list, list]:
    """One example of a property test on the shared `store` fixture (filled with 400 records on the first):
    draws the transfer limits into the store's config (the in-memory ratio from `ratios`) and a list of
    units: a run of the queue's real units with up to six odd ones inserted (a BLANK unit, a zero-size
    unit, one beyond the readable end, one in no commitlog file, or one of `more_units`). Returns (units,
    the run of real units)."""
    if store.find_consume_queue(TOPIC, 0, create=False) is None:  # one store for all examples
        fill(store, 400)
    cfg = store.config  # the limits are read on every get_message
    cfg.max_transfer_count_on_message_in_disk = data.draw(st.integers(1, 40))
    cfg.max_transfer_bytes_on_message_in_disk = data.draw(st.integers(150, 20_000))
    cfg.max_transfer_count_on_message_in_memory = data.draw(st.integers(1, 60))
    cfg.max_transfer_bytes_on_message_in_memory = data.draw(st.integers(150, 40_000))
    cfg.access_message_in_memory_max_ratio = data.draw(st.sampled_from(list(ratios)))  # 0: every record on disk
    real = store.find_consume_queue(TOPIC, 0).get_units(0, 400)
    max_phy = store.commit_log.get_max_offset()
    unit = st.one_of(
        st.sampled_from(real),
        st.just((0, BLANK_UNIT_SIZE, 0)),                      # a BLANK unit
        st.just((0, 0, 0)),                                    # a zero-size unit
        st.tuples(st.just(max_phy - 10), st.just(100), st.just(0)),  # beyond the readable end
        st.tuples(st.just(max_phy + (1 << 20)), st.just(100), st.just(0)),  # no such commitlog file
        *more_units,
    )
    start = data.draw(st.integers(0, len(real) - 1))
    run = real[start:start + data.draw(st.integers(0, 80))]
    inserts = data.draw(st.lists(st.tuples(st.integers(0, 80), unit), max_size=6))
    units = list(run)
    for pos, u in inserts:
        units.insert(min(pos, len(units)), u)
    return units, run
