"""The same QuerySet expressions on the store and on an ordinary SQL table holding the same rows give the
same results (hypothesis generates the expressions; SQLite, or PostgreSQL with RMQ_TEST_DB=postgres).

Events here have one key each, so ``keys=...`` means the same on both sides (on the store it tests
membership among a message's keys); ordering uses non-null fields (databases differ on where NULLs sort)."""

from __future__ import annotations

import time

import pytest
from django.db.models import Q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.django_face.testapp.models import OrderEvent, SqlEvent

N = 48
TAGS = ["Placed", "Paid", "Shipped"]
FIELDS = ["msg_id", "queue_id", "queue_offset", "commit_log_offset", "born_at", "stored_at", "keys", "tags",
          "stream", "version"]
ORDERINGS = [["commit_log_offset"], ["-commit_log_offset"], ["-stored_at", "commit_log_offset"],
             ["queue_id", "-queue_offset"], ["tags", "-commit_log_offset"], ["keys", "commit_log_offset"],
             ["stored_at", "-queue_id", "queue_offset"]]


@pytest.fixture(scope="module")
def store_events(module_store):
    for i in range(N):
        OrderEvent.objects.append({"i": i}, keys=f"k-{i % 7}", tags=TAGS[i % 3],
                                  stream=f"s-{i % 4}" if i % 5 else None)
        if i % 16 == 15:
            time.sleep(0.02)
    return list(OrderEvent.objects.all())


@pytest.fixture
def mirrored(store_events, db):
    SqlEvent.objects.bulk_create(SqlEvent(**{f: getattr(e, f) for f in FIELDS}) for e in store_events)
    return store_events


def _leaves(events):
    times = sorted({e.stored_at for e in events})
    offsets = sorted(e.commit_log_offset for e in events)
    msg_ids = [e.msg_id for e in events]
    some = st.sampled_from
    return st.one_of(
        st.builds(lambda v: Q(keys=v), some([f"k-{i}" for i in range(8)])),
        st.builds(lambda v: Q(keys__in=v), st.lists(some([f"k-{i}" for i in range(8)]), min_size=1, max_size=3)),
        st.builds(lambda v: Q(stream=v), some(["s-0", "s-1", "s-2", "s-3", "s-9"])),
        st.builds(lambda v: Q(stream__in=v), st.lists(some(["s-0", "s-1", "s-3", "s-9"]), min_size=1, max_size=2)),
        st.builds(lambda v: Q(msg_id=v), some(msg_ids)),
        st.builds(lambda v: Q(msg_id__in=v), st.lists(some(msg_ids), min_size=1, max_size=4)),
        st.builds(lambda v: Q(commit_log_offset=v), some(offsets)),
        st.builds(lambda op, v: Q(**{f"commit_log_offset__{op}": v}), some(["gt", "gte", "lt", "lte"]), some(offsets)),
        st.builds(lambda v: Q(tags=v), some(TAGS + ["Nope"])),
        st.builds(lambda v: Q(tags__in=v), st.lists(some(TAGS), min_size=1, max_size=2)),
        st.builds(lambda v: Q(queue_id=v), st.integers(0, 8)),
        st.builds(lambda v: Q(queue_id__in=v), st.lists(st.integers(0, 8), min_size=1, max_size=3)),
        st.builds(lambda op, v: Q(**{f"queue_id__{op}": v}), some(["gt", "gte", "lt", "lte"]), st.integers(0, 8)),
        st.builds(lambda op, v: Q(**{f"queue_offset__{op}": v}), some(["gt", "gte", "lt", "lte", "exact"]),
                  st.integers(0, 20)),
        st.builds(lambda a, b: Q(queue_offset__range=(min(a, b), max(a, b))), st.integers(0, 20), st.integers(0, 20)),
        st.builds(lambda op, v: Q(**{f"stored_at__{op}": v}), some(["gt", "gte", "lt", "lte", "exact"]), some(times)),
        st.builds(lambda a, b: Q(stored_at__range=(min(a, b), max(a, b))), some(times), some(times)),
    )


def _trees(leaf):
    return st.recursive(leaf, lambda children: st.one_of(
        st.builds(lambda a, b: a & b, children, children),
        st.builds(lambda a, b: a | b, children, children),
        st.builds(lambda a: ~a, children),
    ), max_leaves=4)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_store_and_sql_agree(mirrored, data):
    tree = data.draw(_trees(_leaves(mirrored)), label="where")
    second = data.draw(st.none() | _leaves(mirrored), label="then filter")
    excluded = data.draw(st.booleans(), label="exclude")
    ordering = data.draw(st.sampled_from(ORDERINGS), label="order_by")
    lo = data.draw(st.integers(0, 10), label="low")
    hi = data.draw(st.none() | st.integers(lo, lo + 30), label="high")

    def build(manager):
        qs = manager.exclude(tree) if excluded else manager.filter(tree)
        if second is not None:
            qs = qs.filter(second)
        return qs.order_by(*ordering)

    sql, ours = build(SqlEvent.objects), build(OrderEvent.objects.scan())
    assert ours.count() == sql.count()
    assert [e.msg_id for e in ours[lo:hi]] == [e.msg_id for e in sql[lo:hi]]
    assert ours.exists() == sql.exists()
    assert list(ours.values_list("msg_id", "version")[:5]) == list(sql.values_list("msg_id", "version")[:5])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_planned_queries_need_no_scan(mirrored, data):
    """Conjunctions of supported lookups are answered from the index and queues (no scan()) and agree."""
    leaves = data.draw(st.lists(_leaves(mirrored), min_size=1, max_size=3), label="lookups")
    qs_sql, qs_ours = SqlEvent.objects.all(), OrderEvent.objects.all()
    for q in leaves:
        qs_sql, qs_ours = qs_sql.filter(q), qs_ours.filter(q)
    assert [e.msg_id for e in qs_ours] == [e.msg_id for e in qs_sql]
    assert qs_ours.count() == qs_sql.count()
