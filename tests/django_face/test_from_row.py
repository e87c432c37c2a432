"""`EventModel.from_row`'s plain path (the instance's dict filled directly) against Django's ``from_db`` +
``__init__``: the same instance, attribute for attribute and in the same order, and Django's path whenever
something could observe or change construction (signal listeners, an overridden ``__init__`` or ``from_db``,
a data descriptor, a subset of the fields)."""

from __future__ import annotations

from typing import Any

import pytest
from django.db.models.signals import post_init, pre_init

from rmq_eventstore.django.models import EventModel, _plain_init_names
from tests.django_face.testapp.models import AuditEvent, OrderEvent, PlacedEvent


def _row(i: int = 0) -> dict[str, Any]:
    return {"msg_id": f"ID{i}", "queue_id": 3, "queue_offset": 10 + i, "commit_log_offset": 4096 * i,
            "born_at": None, "stored_at": None, "keys": "a b", "tags": "Placed", "stream": "s-1", "version": i,
            "properties": {"k": "v"}, "body": b'{"x":1}', "data": {"x": 1}}


def _reference(cls: type[EventModel], db: str | None, names: list[str], row: dict[str, Any]) -> EventModel:
    obj = cls.from_db(db, names, [row[a] for a in names])
    obj.topic = cls.topic
    return obj


def _same(a: EventModel, b: EventModel) -> None:
    da, db_ = dict(a.__dict__), dict(b.__dict__)
    sa, sb = da.pop("_state"), db_.pop("_state")
    assert list(a.__dict__) == list(b.__dict__)  # the same attributes in the same order
    assert da == db_
    assert type(sa) is type(sb) and sa.__dict__ == sb.__dict__
    assert type(a) is type(b)
    assert a == b and a.pk == b.pk and a.topic == b.topic
    assert not a._state.adding and a._state.db == b._state.db


@pytest.mark.parametrize("model", [OrderEvent, PlacedEvent, AuditEvent])
@pytest.mark.parametrize("db", [None, "default"])
def test_plain_path_makes_what_from_db_makes(model, db):
    names = [f.attname for f in model._meta.concrete_fields]
    assert _plain_init_names(model) == names
    for i in range(3):
        _same(model.from_row(db, list(names), _row(i)), _reference(model, db, names, _row(i)))


def test_a_listener_takes_djangos_path():
    names = [f.attname for f in OrderEvent._meta.concrete_fields]
    seen: list[Any] = []

    def pre(sender, **kw):
        seen.append(("pre", sender))

    def post(sender, instance, **kw):
        seen.append(("post", sender, instance.msg_id))

    for signal, receiver in ((pre_init, pre), (post_init, post)):
        signal.connect(receiver, sender=OrderEvent)
        try:
            seen.clear()
            obj = OrderEvent.from_row(None, names, _row(7))
            assert seen and seen[0][1] is OrderEvent
            _same(obj, _reference(OrderEvent, None, names, _row(7)))
        finally:
            signal.disconnect(receiver, sender=OrderEvent)
    seen.clear()
    OrderEvent.from_row(None, names, _row(8))
    assert seen == []
    pre_init.connect(pre, sender=PlacedEvent)  # a listener on another model: this one stays plain
    try:
        seen.clear()
        _same(OrderEvent.from_row(None, names, _row(9)), _reference(OrderEvent, None, names, _row(9)))
        assert seen == []
    finally:
        pre_init.disconnect(pre, sender=PlacedEvent)


def test_overridden_init_from_db_or_a_descriptor_takes_djangos_path():
    calls: list[str] = []

    class InitEvent(EventModel):
        topic = "init-events"

        class Meta:
            app_label = "testapp"

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            calls.append("init")
            super().__init__(*args, **kwargs)

    class FromDbEvent(EventModel):
        topic = "from-db-events"

        class Meta:
            app_label = "testapp"

        @classmethod
        def from_db(cls, db, field_names, values):
            calls.append("from_db")
            return super().from_db(db, field_names, values)

    class _Upper:
        def __get__(self, obj, cls=None):
            return self if obj is None else obj.__dict__["keys"].upper()

        def __set__(self, obj, value):
            calls.append("set")
            obj.__dict__["keys"] = value

    class DescEvent(EventModel):
        topic = "desc-events"

        class Meta:
            app_label = "testapp"

    DescEvent.keys = _Upper()
    for model, mark in ((InitEvent, "init"), (FromDbEvent, "from_db"), (DescEvent, "set")):
        names = [f.attname for f in model._meta.concrete_fields]
        calls.clear()
        obj = model.from_row(None, names, _row(1))
        assert mark in calls
        assert obj.msg_id == "ID1" and not obj._state.adding and obj.topic == model.topic
    assert _plain_init_names(DescEvent) is None


def test_a_subset_of_fields_takes_djangos_path():
    names = ["msg_id", "queue_id", "queue_offset", "commit_log_offset"]
    row = _row(2)
    _same(OrderEvent.from_row("default", names, row), _reference(OrderEvent, "default", names, row))
