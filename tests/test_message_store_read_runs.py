"""The match-all read path of `MessageStore.get_message` (one slice per run of consecutive records) must
return exactly what the general unit-by-unit loop returns: statuses, next_begin_offset, transfer limits,
BLANK units, removed records, unreadable units and runs that cross a commitlog file boundary."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.store import GetMessageResult, GetMessageStatus, Message, MessageFilter, MessageStore
from rmq_eventstore.store.message_store import BLANK_UNIT_SIZE

COMMITLOG_FILE_SIZE = 64 * 1024  # tests/conftest.py's SMALL_GEOMETRY


def _fill(store: MessageStore, n: int) -> None:
    for i in range(0, n, 10):
        store.put_messages([Message(topic="T", body=bytes([j % 251]) * (100 + 37 * (j % 9)), tags=f"t{j % 3}",
                                    keys=f"k{j}", queue_id=0) for j in range(i, i + 10)])
    assert store.wait_for_dispatch()


def _both(store: MessageStore, units: list[tuple[int, int, int]], offset: int, max_nums: int,
          max_total: int) -> tuple[object, object]:
    max_phy = store.commit_log.get_max_offset()
    min_phy = store.commit_log.get_min_offset()

    def fresh() -> GetMessageResult:
        return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, offset, 0, 999)

    fast = store._get_matching_all(fresh(), units, offset, max_nums, max_total, max_phy, min_phy)
    slow = store._get_by_units(fresh(), units, offset, max_nums, max_total, max_phy, min_phy, None)
    return fast, slow


def test_runs_cross_commitlog_files_and_equal_the_unit_loop(open_store):
    store = open_store(max_transfer_count_on_message_in_memory=1000,
                       max_transfer_bytes_on_message_in_memory=1 << 20)
    _fill(store, 600)  # ~120 KiB over 64 KiB commitlog files: several files, each ended by a blank record
    units = store.find_consume_queue("T", 0).get_units(0, 600)
    assert len({u[0] // COMMITLOG_FILE_SIZE for u in units}) >= 2
    fast, slow = _both(store, units, 0, 600, 1 << 30)
    assert fast == slow
    assert fast.status is GetMessageStatus.FOUND and len(fast.message_buffers) == 600
    assert [m.queue_offset for m in fast.messages] == list(range(600))
    assert [m.keys for m in fast.messages] == [f"k{j}" for j in range(600)]
    r = store.get_message("g", "T", 0, 200, 32, MessageFilter("*"))
    assert [m.queue_offset for m in r.messages] == list(range(200, 232)) and r.next_begin_offset == 232
    assert b"".join(r.message_buffers) == bytes(store.commit_log.get_message(
        r.commit_log_offsets[0], r.commit_log_offsets[-1] + len(r.message_buffers[-1]) - r.commit_log_offsets[0]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_crafted_units_give_the_same_result_as_the_unit_loop(store, data):
    if store.find_consume_queue("T", 0, create=False) is None:  # one store for all examples
        _fill(store, 400)
    cfg = store.config  # the limits are read on every get_message
    cfg.max_transfer_count_on_message_in_disk = data.draw(st.integers(1, 40))
    cfg.max_transfer_bytes_on_message_in_disk = data.draw(st.integers(150, 20_000))
    cfg.max_transfer_count_on_message_in_memory = data.draw(st.integers(1, 60))
    cfg.max_transfer_bytes_on_message_in_memory = data.draw(st.integers(150, 40_000))
    cfg.access_message_in_memory_max_ratio = data.draw(st.sampled_from([0, 40]))  # 0: every record on disk
    real = store.find_consume_queue("T", 0).get_units(0, 400)
    max_phy = store.commit_log.get_max_offset()
    unit = st.one_of(
        st.sampled_from(real),
        st.just((0, BLANK_UNIT_SIZE, 0)),                      # a BLANK unit
        st.just((0, 0, 0)),                                    # a zero-size unit
        st.tuples(st.just(max_phy - 10), st.just(100), st.just(0)),  # beyond the readable end
        st.tuples(st.just(max_phy + (1 << 20)), st.just(100), st.just(0)),  # no such commitlog file
    )
    start = data.draw(st.integers(0, len(real) - 1))
    run = real[start:start + data.draw(st.integers(0, 80))]
    inserts = data.draw(st.lists(st.tuples(st.integers(0, 80), unit), max_size=6))
    units = list(run)
    for pos, u in inserts:
        units.insert(min(pos, len(units)), u)
    fast, slow = _both(store, units, 7, data.draw(st.integers(1, 64)), data.draw(st.integers(100, 30_000)))
    assert fast == slow
