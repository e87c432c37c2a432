"""The match-all read path of `MessageStore.get_message` (one slice per run of consecutive records) must
return exactly what the general unit-by-unit loop returns: statuses, next_begin_offset, transfer limits,
BLANK units, removed records, unreadable units and runs that cross a commitlog file boundary."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.store import GetMessageStatus, MessageFilter
from tests.match_all_helpers import COMMITLOG_FILE_SIZE, draw_crafted_read, fill, match_all_reads


def test_runs_cross_commitlog_files_and_equal_the_unit_loop(open_store):
    store = open_store(max_transfer_count_on_message_in_memory=1000,
                       max_transfer_bytes_on_message_in_memory=1 << 20)
    fill(store, 600)  # ~120 KiB over 64 KiB commitlog files: several files, each ended by a blank record
    units = store.find_consume_queue("T", 0).get_units(0, 600)
    assert len({u[0] // COMMITLOG_FILE_SIZE for u in units}) >= 2
    fast, slow = match_all_reads(store, units, 0, 600, 1 << 30)
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
    units, _ = draw_crafted_read(data, store, [0, 40])
    fast, slow = match_all_reads(store, units, 7, data.draw(st.integers(1, 64)), data.draw(st.integers(100, 30_000)))
    assert fast == slow
