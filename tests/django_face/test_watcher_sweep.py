"""The transaction watcher's sweep (every 0.5 s) costs what is pending, not its square: one atomic block that
appends many events holds one ``on_commit`` callback and one pending append per event, and the sweep looks
for each pending append's callback among the connection's ``run_on_commit``. It reads that list once per
connection and sweep, not once per pending append (300 appends: 300 callbacks looked at, not 90,000)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, transaction

from rmq_eventstore.django.transactions import watcher
from tests.django_face.testapp.models import OrderEvent


def visible(stream: str, n: int, timeout: float = 10.0) -> list[str]:
    """The msg ids of `stream` in version order, once there are `n` (the ENDs sent at commit land shortly)."""
    deadline = time.monotonic() + timeout
    while True:
        got = [e.msg_id for e in OrderEvent.objects.filter(stream=stream).order_by("version")]
        if len(got) >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.05)


class _CountingList(list):
    """`run_on_commit` that counts the callbacks a walk of it by one thread looks at."""

    def __init__(self, items: list, thread: int) -> None:
        super().__init__(items)
        self.thread = thread
        self.seen = 0

    def __iter__(self):  # noqa: ANN204
        if threading.get_ident() == self.thread:
            self.seen += len(self)
        return super().__iter__()


@pytest.mark.django_db(transaction=True)
def test_a_sweep_reads_run_on_commit_once_per_connection(event_store):
    n = 300
    with transaction.atomic():
        events = OrderEvent.objects.bulk_append([{"i": i} for i in range(n)], stream="bulk-1", expected_version=0)
        assert len(connection.run_on_commit) >= n and watcher.pending_count() >= n
        counting = connection.run_on_commit = _CountingList(connection.run_on_commit, threading.get_ident())
        time.sleep(0.1)  # older than the sweep's 50 ms: every pending append is looked at
        watcher.sweep()
        # each callback is still there (the block is open): nothing was ended
        assert watcher.pending_count() >= n
        assert counting.seen <= 2 * len(counting), counting.seen  # once per connection (was n * n)
    # the block committed: every append is visible, in order
    assert visible("bulk-1", n) == [e.msg_id for e in events]


@pytest.mark.django_db(transaction=True)
def test_a_sweep_still_rolls_back_a_discarded_block_among_open_ones(event_store):
    with transaction.atomic():
        kept = OrderEvent.objects.bulk_append([{"i": i} for i in range(20)], stream="open-1", expected_version=0)
        with pytest.raises(RuntimeError), transaction.atomic():  # a savepoint: its callbacks are discarded
            gone = OrderEvent.objects.append({"x": 1}, stream="gone-1", expected_version=0)
            raise RuntimeError("the inner block failed")
        time.sleep(0.1)
        watcher.sweep()
        # the discarded append was ended (rolled back): its stream is free again; the open ones are pending
        assert gone.msg_id not in {e.msg_id for e in OrderEvent.objects.filter(stream="gone-1")}
        assert watcher.pending_count() >= len(kept)
    assert visible("open-1", len(kept)) == [e.msg_id for e in kept]
    assert OrderEvent.objects.append({"y": 1}, stream="gone-1", expected_version=0).version == 1
