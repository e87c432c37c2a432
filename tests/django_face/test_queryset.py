"""EventQuerySet against a real store (embedded broker): Django's QuerySet semantics on an event topic."""

from __future__ import annotations

import asyncio
import datetime
import time
import warnings

import pytest
from django.core.paginator import Paginator, UnorderedObjectListWarning
from django.db import NotSupportedError
from django.db.models import Count, Max, Min, Q

from tests.django_face.testapp.models import AuditEvent, OrderEvent, PlacedEvent

TAGS = ("Placed", "Paid", "Shipped")


@pytest.fixture(scope="module")
def events(module_store):
    """40 order events (streams order-0..4 and some without a stream), 3 audit events."""
    appended = []
    for i in range(40):
        stream = f"order-{i % 5}" if i % 8 else None
        appended.append(OrderEvent.objects.append({"n": i, "customer": f"c{i % 3}"}, keys=[f"o-{i}", f"c-{i % 3}"],
                                                  tags=TAGS[i % 3], stream=stream))
        if i == 19:
            time.sleep(0.05)  # a gap in store times, for time ranges
    for i in range(3):
        AuditEvent.objects.append({"a": i}, keys="audit")
    return [OrderEvent.objects.get(pk=e.msg_id) for e in appended]


def ids(qs):
    return [e.msg_id for e in qs]


def test_all_count_and_order(events):
    qs = OrderEvent.objects.all()
    assert qs.count() == 40
    assert ids(qs) == [e.msg_id for e in sorted(events, key=lambda e: e.commit_log_offset)]
    assert ids(qs.reverse())[:3] == [e.msg_id for e in sorted(events, key=lambda e: -e.commit_log_offset)][:3]
    assert qs.ordered
    assert AuditEvent.objects.count() == 3


def test_fields_mirror_the_record(events):
    e = OrderEvent.objects.get(keys="o-9")
    assert e.data == {"n": 9, "customer": "c0"}
    assert e.keys == "o-9 c-0"  # the stream id the broker adds to the keys is not shown
    assert e.tags == "Placed" and e.stream == "order-4" and e.version >= 1
    assert e.topic == "orders"
    assert e.stored_at.tzinfo is not None and e.born_at <= e.stored_at + datetime.timedelta(seconds=1)
    assert bytes(e.body) == b'{"n":9,"customer":"c0"}'
    assert e.commit_log_offset >= 0 and e.queue_offset >= 0
    assert str(e).startswith("OrderEvent ")


def test_filters_by_index(events):
    assert [e.data["n"] for e in OrderEvent.objects.filter(keys="c-1")] == [i for i in range(40) if i % 3 == 1]
    assert OrderEvent.objects.filter(keys__in=["o-1", "o-2", "nope"]).count() == 2
    s = OrderEvent.objects.filter(stream="order-2").order_by("version")
    assert [e.version for e in s] == list(range(1, len(s) + 1))
    assert OrderEvent.objects.filter(stream="order-2", version__gt=2).count() == len(s) - 2
    assert OrderEvent.objects.filter(msg_id=events[5].msg_id).get().data["n"] == 5
    assert OrderEvent.objects.filter(commit_log_offset=events[7].commit_log_offset).get().msg_id == events[7].msg_id
    assert OrderEvent.objects.filter(keys="audit").count() == 0  # another topic's key
    assert ids(OrderEvent.objects.filter(Q(keys="o-3") | Q(stream="order-1")).order_by("commit_log_offset")) == \
        [e.msg_id for e in events if e.keys.startswith("o-3 ") or e.stream == "order-1"]


def test_filters_by_queue_tags_and_time(events):
    by_tag = OrderEvent.objects.filter(tags="Shipped")
    assert by_tag.count() == len([i for i in range(40) if i % 3 == 2])
    assert OrderEvent.objects.filter(tags__in=["Placed", "Paid"]).count() == 40 - by_tag.count()
    q = events[0].queue_id
    in_q = [e for e in events if e.queue_id == q]
    assert OrderEvent.objects.filter(queue_id=q).count() == len(in_q)
    assert OrderEvent.objects.filter(queue_id=q, queue_offset__gte=1).count() == len(in_q) - 1
    cut = events[20].stored_at
    assert OrderEvent.objects.filter(stored_at__gte=cut).count() == len([e for e in events if e.stored_at >= cut])
    assert OrderEvent.objects.filter(stored_at__lt=cut).count() == len([e for e in events if e.stored_at < cut])
    assert OrderEvent.objects.filter(stored_at__range=(events[0].stored_at, events[-1].stored_at)).count() == 40
    assert PlacedEvent.objects.count() == len([i for i in range(40) if i % 3 == 0])
    assert set(PlacedEvent.objects.values_list("tags", flat=True)) == {"Placed"}
    assert OrderEvent.objects.exclude(tags="Placed").count() == 40 - PlacedEvent.objects.count()


def test_slicing_first_last_exists(events):
    qs = OrderEvent.objects.order_by("-commit_log_offset")
    assert ids(qs[:5]) == [e.msg_id for e in sorted(events, key=lambda e: -e.commit_log_offset)][:5]
    assert ids(qs[5:8]) == [e.msg_id for e in sorted(events, key=lambda e: -e.commit_log_offset)][5:8]
    assert qs[3].msg_id == sorted(events, key=lambda e: -e.commit_log_offset)[3].msg_id
    with pytest.raises(IndexError):
        qs[1000]
    assert qs[5:8].count() == 3 and qs[38:].count() == 2
    assert OrderEvent.objects.first().data["n"] == 0 and OrderEvent.objects.last().data["n"] == 39
    assert OrderEvent.objects.filter(keys="o-1").exists() and not OrderEvent.objects.filter(keys="zz").exists()
    assert OrderEvent.objects.none().count() == 0 and list(OrderEvent.objects.none()) == []
    by_time = OrderEvent.objects.order_by("-stored_at", "msg_id")[:10]
    assert [e.stored_at for e in by_time] == sorted((e.stored_at for e in events), reverse=True)[:10]


def test_get_errors(events):
    with pytest.raises(OrderEvent.DoesNotExist, match="OrderEvent matching query does not exist"):
        OrderEvent.objects.get(keys="missing")
    with pytest.raises(OrderEvent.MultipleObjectsReturned, match="more than one"):
        OrderEvent.objects.get(keys="c-0")


def test_values_in_bulk_dates_aggregate(events):
    row = OrderEvent.objects.filter(keys="o-4").values("msg_id", "data", "version").get()
    assert row["data"]["n"] == 4 and set(row) == {"msg_id", "data", "version"}
    assert OrderEvent.objects.filter(keys="o-4").values_list("tags", "stream").get() == ("Paid", "order-4")
    assert sorted(OrderEvent.objects.filter(keys="c-2").values_list("queue_offset", flat=True)) == \
        sorted(e.queue_offset for e in events if e.keys.endswith("c-2"))
    bulk = OrderEvent.objects.in_bulk([events[1].msg_id, events[2].msg_id])
    assert set(bulk) == {events[1].msg_id, events[2].msg_id}
    assert OrderEvent.objects.dates("stored_at", "day") == [events[0].stored_at.date()]
    agg = OrderEvent.objects.aggregate(first=Min("stored_at"), last=Max("stored_at"), n=Count("pk"))
    assert agg == {"first": events[0].stored_at, "last": events[-1].stored_at, "n": 40}


def test_unsupported_lookups_are_clear(events):
    with pytest.raises(NotSupportedError, match="data__…__exact without an index lookup; supported: msg_id"):
        OrderEvent.objects.filter(data__n=3).count()
    with pytest.raises(NotSupportedError, match="born_at__gte"):
        list(OrderEvent.objects.filter(born_at__gte=events[0].born_at))
    # beside an index lookup, or after scan(), any lookup is evaluated
    assert OrderEvent.objects.filter(keys="c-0", data__n__gte=30).count() == len([i for i in range(30, 40) if i % 3 == 0])
    assert OrderEvent.objects.scan().filter(data__customer="c1", born_at__gte=events[0].born_at).count() == \
        len([i for i in range(40) if i % 3 == 1])
    assert OrderEvent.objects.filter(keys="o-5", body__contains=b'"n":5').count() == 1
    for refused in (lambda: OrderEvent.objects.all().delete(), lambda: OrderEvent.objects.update(tags="x"),
                    lambda: OrderEvent.objects.create(msg_id="x"), lambda: OrderEvent.objects.annotate(n=Count("pk"))):
        with pytest.raises(NotSupportedError):
            refused()
    with pytest.raises(TypeError, match="immutable"):
        events[0].save()


def test_paginator_without_warnings_and_no_sql(events):
    # no django_db mark: any SQL would raise "Database access not allowed"
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnorderedObjectListWarning)
        p = Paginator(OrderEvent.objects.order_by("-commit_log_offset"), 7)
        assert p.count == 40 and p.num_pages == 6
        assert len(p.page(6).object_list) == 5


def test_async_variants(events):
    async def run():
        n = await OrderEvent.objects.acount()
        got = await OrderEvent.objects.aget(keys="o-7")
        seen = [e.msg_id async for e in OrderEvent.objects.filter(keys="c-1")]
        first = await OrderEvent.objects.afirst()
        exists = await OrderEvent.objects.filter(keys="o-1").aexists()
        return n, got.data["n"], len(seen), first.data["n"], exists

    assert asyncio.run(run()) == (40, 7, len([i for i in range(40) if i % 3 == 1]), 0, True)


def test_iterator_streams(events):
    it = OrderEvent.objects.order_by("commit_log_offset").iterator(chunk_size=4)
    assert [next(it).data["n"] for _ in range(3)] == [0, 1, 2]


def test_explain_names_the_plan(events):
    assert OrderEvent.objects.filter(keys="o-1").explain().startswith("IndexPlan")
    assert OrderEvent.objects.filter(tags="Paid").explain().startswith("QueuePlan")


def test_django_rest_framework_generic_views(events, client):
    r = client.get("/api/events/?limit=5&offset=10")
    body = r.json()
    assert r.status_code == 200 and body["count"] == 40 and len(body["results"]) == 5
    assert [x["data"]["n"] for x in body["results"]] == [10, 11, 12, 13, 14]
    seen, url = [], "/api/events-by-cursor/"
    while url:
        page = client.get(url).json()
        seen += [x["data"]["n"] for x in page["results"]]
        url = page["next"]
    assert seen == list(range(39, -1, -1))
    one = client.get(f"/api/events/{events[3].msg_id}/").json()
    assert one["data"] == {"n": 3, "customer": "c0"} and one["msg_id"] == events[3].msg_id
    assert client.get("/api/events/NOPE/").status_code == 404
