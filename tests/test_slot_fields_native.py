"""`_native.slot_getattr` / `slot_setattr` (SLOT FIELDS in _native.c: how `dispatch_singles` reads and writes
its objects' fields, by slot offset) against `getattr` / `setattr`.

They may take a slot's offset only where the generic protocol would read or write that very slot; everywhere
else they must do what it does. Objects of many shapes (slots with and without a `__dict__`, a subclass
putting a property over a base's slot, `__getattr__`, `__setattr__`, `__getattribute__`, a class attribute,
an unset slot, a name that is not a slot) are read and written both ways, alternating between the shapes so
the helpers' per-type cache is exercised; values, exceptions, state and the calls the hooks saw must be the
same. A class changed after the helpers cached its slot (a property put in its place, then removed) must be
followed. The functions are called directly, so the file also runs under `RMQ_EVENTSTORE_PURE=1`.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.store.commitlog import CommitLog
from rmq_eventstore.store.consume_queue import ConsumeQueue
from rmq_eventstore.store.index import IndexFile, IndexService
from rmq_eventstore.store.mapped_file import MappedFile, MappedFileQueue
from rmq_eventstore.store.reput import ReputMessageService
from tests.conftest import import_native

_native = import_native()

NAMES = ("a", "b", "c", "extra", "missing")


class Slots:
    __slots__ = ("a", "b", "c")

    def __init__(self, calls: list) -> None:
        self.a, self.b = 1, "x"  # c stays unset: its AttributeError


class SlotsDict:
    __slots__ = ("a", "b", "c", "__dict__")

    def __init__(self, calls: list) -> None:
        self.a, self.b, self.c, self.extra = 1 << 40, None, 3, "in the dict"


class SubProp(SlotsDict):
    """A property over the base's slot `b`: the property decides, not the slot."""

    def __init__(self, calls: list) -> None:
        self.calls = calls
        super().__init__(calls)

    @property
    def b(self) -> object:
        self.calls.append(("get b",))
        return self.__dict__.get("_b", "prop")

    @b.setter
    def b(self, v: object) -> None:
        self.calls.append(("set b", v))
        self.__dict__["_b"] = v


class SubSlots(SlotsDict):
    __slots__ = ("d",)


class Getattribute(SlotsDict):
    def __getattribute__(self, name: str) -> object:
        if name == "a":
            return "hooked"
        return object.__getattribute__(self, name)


class Getattr(Slots):
    __slots__ = ()

    def __getattr__(self, name: str) -> str:  # an unset slot or a missing name come here
        return f"fallback:{name}"


class Setattr(SlotsDict):
    def __init__(self, calls: list) -> None:
        object.__setattr__(self, "calls", calls)
        super().__init__(calls)

    def __setattr__(self, name: str, v: object) -> None:
        self.calls.append(("setattr", name, v))
        object.__setattr__(self, name, v)


class Plain:
    c = "class attribute"

    def __init__(self, calls: list) -> None:
        self.a, self.b = 1, 2


SHAPES = (Slots, SlotsDict, SubProp, SubSlots, Getattribute, Getattr, Setattr, Plain)


def _outcome(fn, *args) -> tuple:  # noqa: ANN001 - getattr / setattr or their C twins
    try:
        return "ok", fn(*args)
    except Exception as e:  # noqa: BLE001 - the exception is the outcome compared
        return "raised", type(e), str(e)


def _state(o: object) -> tuple:
    slots = tuple(_outcome(object.__getattribute__, o, n) for n in ("a", "b", "c"))
    d = _outcome(object.__getattribute__, o, "__dict__")
    return slots, dict(d[1]) if d[0] == "ok" else None


@pytest.mark.parametrize("get,put", [(_native.slot_getattr, _native.slot_setattr),
                                     (_native.slot_getattr_any, _native.slot_setattr_any)], ids=["field", "any"])
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.differing_executors])
@given(ops=st.lists(st.tuples(st.sampled_from(SHAPES), st.booleans(), st.sampled_from(NAMES),
                              st.integers(-(1 << 62), 1 << 62)), max_size=30))
def test_slot_fields_equal_getattr_setattr(get, put, ops) -> None:
    """Reads and writes on objects of mixed shapes, each pair alike: one through getattr / setattr, its twin
    through the C helpers (the dispatch pass's per-field caches, or the (name, type) table of
    single_attr_i64 and the single put); then the same slots, instance dicts and hook calls."""
    pairs: dict = {}
    for shape, write, name, v in ops:
        if shape not in pairs:
            ref_calls: list = []
            c_calls: list = []
            pairs[shape] = (shape(ref_calls), shape(c_calls), ref_calls, c_calls)
        ref, c, _, _ = pairs[shape]
        if write:
            assert _outcome(put, c, name, v) == _outcome(setattr, ref, name, v)
        else:
            assert _outcome(get, c, name) == _outcome(getattr, ref, name)
    for ref, c, ref_calls, c_calls in pairs.values():
        assert _state(c) == _state(ref) and c_calls == ref_calls


@pytest.mark.parametrize("get,put", [(_native.slot_getattr, _native.slot_setattr),
                                     (_native.slot_getattr_any, _native.slot_setattr_any)], ids=["field", "any"])
def test_slot_fields_follow_a_class_changed_later(get, put) -> None:
    """A property put on a class in place of a slot the helpers read and wrote (the type's version tag
    changes) takes over, as it does for getattr; with the slot's descriptor back, the slot again."""

    class Late:
        __slots__ = ("n", "__dict__")

        def __init__(self) -> None:
            self.n = 1

    o = Late()
    slot = Late.__dict__["n"]
    assert get(o, "n") == 1
    put(o, "n", 2)
    assert slot.__get__(o) == 2
    seen = []
    Late.n = property(lambda self: 40, lambda self, v: seen.append(v))
    assert get(o, "n") == 40 == o.n
    put(o, "n", 3)
    assert seen == [3] and slot.__get__(o) == 2
    Late.n = slot
    assert get(o, "n") == 2
    put(o, "n", 5)
    assert o.n == 5


def test_the_dispatch_fields_are_slots() -> None:
    """The fields `dispatch_singles` and the single put read and write are slots of their classes (else the pass still works,
    through the generic protocol, but pays the look-ups this block removes), and the classes keep a
    `__dict__` and weak references for everything else."""
    fields = {
        MappedFile: ("file_from_offset", "file_size", "read_only", "first_create_in_queue", "wrote_position",
                     "committed_position", "transient", "_write_view", "store_timestamp"),
        CommitLog: ("mapped_file_queue", "topic_queue_table", "begin_time_in_lock", "on_appended"),
        MappedFileQueue: ("mapped_files",),
        ConsumeQueue: ("read_only", "_max_physic_offset", "mapped_file_queue"),
        IndexFile: ("read_only", "_index_count", "index_num", "hash_slot_num", "_entries_base", "_begin_timestamp",
                    "_end_timestamp", "_begin_phy_offset", "_end_phy_offset", "_hash_slot_count", "mm", "_dirty"),
        IndexService: ("read_only", "_files"),
        ReputMessageService: ("reput_from_offset", "dispatched_offset", "_pending", "_pending_count", "_signalled",
                              "listeners", "_gated", "_wakeup"),
    }
    for cls, names in fields.items():
        assert set(names) <= set(cls.__slots__), cls
        assert "__dict__" in cls.__slots__ and "__weakref__" in cls.__slots__, cls
