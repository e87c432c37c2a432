"""`once`: an event handler's database writes happen once per event, however often it is delivered."""

from __future__ import annotations

import datetime

import pytest

from rmq_eventstore.common.event import Event
from rmq_eventstore.django.handlers import already_handled, once
from rmq_eventstore.django.marker import HandledEvent
from tests.django_face.testapp.models import Order


def event(msg_id: str, n: int) -> Event:
    return Event(msg_id, "orders", 0, n, n * 100, datetime.datetime.now(datetime.UTC), "Placed", (), None, None,
                 b"{}", {"number": f"N-{n}"})


@pytest.mark.django_db(transaction=True)
def test_duplicates_are_skipped_and_failures_leave_no_row():
    calls = []

    @once("projector")
    def project(e: Event) -> str:
        calls.append(e.msg_id)
        Order.objects.create(number=e.data["number"])
        if e.data["number"] == "N-3":
            raise RuntimeError("handler failed")
        return "done"

    assert project(event("A", 1)) == "done"
    assert project(event("A", 1)) is None  # redelivered: skipped, no second row
    assert project(event("B", 2)) == "done"
    with pytest.raises(RuntimeError):
        project(event("C", 3))
    assert not already_handled("projector", event("C", 3))  # rolled back with the handler's writes
    assert not Order.objects.filter(number="N-3").exists()
    assert calls == ["A", "B", "C"]
    assert sorted(Order.objects.values_list("number", flat=True)) == ["N-1", "N-2"]
    assert HandledEvent.objects.filter(group="projector").count() == 2
    assert already_handled("projector", event("A", 1)) and not already_handled("other", event("A", 1))
