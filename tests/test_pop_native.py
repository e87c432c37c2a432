"""The POP receipt-handle loops in C (`_native.pop_set_handles`, `_native.pop_ack_scan`, used by
`PopConsumer.pop` and `_ack_requests`) against their pure-Python references (`pop_set_handles_py`,
`pop_ack_scan_py`): same index returned, same properties strings, same bits, on generated messages that mix
what the loops handle with what they must leave to the caller (other topics, queues without a lead, parsed
properties, other types, handles that do not parse, a POP_CK not at a property boundary). And the broker's POP
offset helpers (`_native.offsets_text`, `_native.int_run`) against `offsets_text_py` and `int_run_py`: the same
text for any run of int64 offsets, the same answer for lists of ints, bools, floats, big ints and strings.

Skips when the extension is not built, unless `RMQ_EVENTSTORE_REQUIRE_NATIVE=1`."""

from __future__ import annotations

import copy

from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.client.pop_consumer import _LEAD, pop_ack_scan_py, pop_set_handles_py
from rmq_eventstore.common import MessageExt
from rmq_eventstore.common.pop import int_run_py, offsets_text_py
from tests.conftest import import_native

_native = import_native()


class Other(MessageExt):
    """Not a MessageExt exactly: both loops must stop at it."""

    __slots__ = ()


def msg(topic: str, qid: int, offset: int, props: str, parsed: bool = False, cls: type = MessageExt) -> MessageExt:
    m = cls(0, 0, 0, qid, 0, offset, 0, 0, 0, b"\0\0\0\0", 0, 0, b"\0\0\0\0", 0, 0, 0, b"", topic, props)
    if parsed:
        m.properties  # noqa: B018  # parsed now
    return m


def state(msgs: list[MessageExt]) -> list[tuple]:
    return [(type(m).__name__, m.topic, m.properties_string, m._properties) for m in msgs]


PROPS = st.sampled_from(["", "TAGS\x01a\x02", "KEYS\x01k1 k2\x02UNIQ_KEY\x01ABC", "\u00e9\x01\u4e2d\x02", "A\x01B"])
class Watched(MessageExt):
    """Not a MessageExt exactly, with its own __setattr__ (the C loops read and write it generically when
    it is the class they are given)."""

    __slots__ = ()

    def __setattr__(self, name: str, value: object) -> None:
        object.__setattr__(self, name, value)


# queue offsets: 64-bit ones are written by the C loop itself, wider and negative ones too (str(int) text)
OFFSETS = st.one_of(st.integers(0, 2**40), st.sampled_from([0, 9, 10, 2**63 - 1, 2**63, 2**64 + 5, -1, -(2**63)]))
MSG = st.tuples(st.sampled_from(["T", "%RETRY%g_T", "U", "T\u00e9", "\u4e2d"]), st.integers(0, 3), OFFSETS, PROPS,
                st.booleans(), st.sampled_from([MessageExt, MessageExt, MessageExt, Other]))


@settings(max_examples=300, deadline=None)
@given(st.lists(MSG, max_size=12), st.dictionaries(st.integers(0, 3), st.text(max_size=6).map(lambda s: _LEAD + s)),
       st.integers(0, 12))
def test_set_handles_same_as_reference(specs: list, leads: dict, start: int) -> None:
    for cls in (MessageExt, Watched):  # read in place, then generically (and the bound class changes)
        a = [msg(*s[:5], cls=cls if s[5] is MessageExt else s[5]) for s in specs]
        b = copy.deepcopy(a)
        start = min(start, len(a))
        i = _native.pop_set_handles(a, start, cls, "T", leads)
        j = pop_set_handles_py(b, start, cls, "T", leads)
        assert i == j
        assert state(a) == state(b)


HANDLE = st.sampled_from(["5 100 60000 3 0 broker-a 1 ", "5 100 60000 3 1 broker-a 0 ", "7 100 60000 3 0 b 2 "])
LAST = st.sampled_from(["5", "6", "36", "x", "", " 9", "1_0", "12\x00",
                        # read in place by the C loop (1 to 18 ASCII digits) or left to int(): more digits,
                        # signs, leading zeros, other Unicode digits, a 64-bit overflow of the difference
                        "0007", "123456789012345678", "1234567890123456789", "99999999999999999999999", "+5", "-3",
                        "\u0661\u0662", "9223372036854775807"])


class Name(str):
    """A str subclass as a message's topic: the C loop looks it up every time (no cached entry)."""

    __slots__ = ()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["T", "U", "T", Name("T")]), HANDLE, LAST, PROPS, st.booleans(),
                          st.booleans(), st.sampled_from([MessageExt, MessageExt, Other])), max_size=12),
       st.lists(st.tuples(st.sampled_from(["T", "U"]), HANDLE,
                          st.one_of(st.integers(0, 10), st.sampled_from([-(2**63), 2**63 - 1, 2**64, -(2**70)]))),
                max_size=4), st.integers(0, 12))
def test_ack_scan_same_as_reference(specs: list, entries: list, start: int) -> None:
    for base in (MessageExt, Watched):  # read in place, then generically (and the bound class changes)
        msgs = []
        for topic, prefix, last, props, parsed, glued, cls in specs:
            # the handle as pop appends it, or glued to the previous property without a separator (not a handle)
            sep = "" if glued else "\x02"
            s = f"{props}{sep if props and not props.endswith(chr(2)) else ''}{_LEAD}{prefix}{last}\x02"
            if glued and props and not props.endswith("\x02"):
                s = f"{props}{_LEAD}{prefix}{last}\x02"
            msgs.append(msg(topic, 0, 0, s, parsed, base if cls is MessageExt else cls))
        acks_a = {(t, p.rstrip(" ")): (so, []) for t, p, so in entries}
        acks_b = {k: (v[0], []) for k, v in acks_a.items()}
        start = min(start, len(msgs))
        msgs_b = copy.deepcopy(msgs)
        i = _native.pop_ack_scan(msgs, start, base, _LEAD, acks_a)
        j = pop_ack_scan_py(msgs_b, start, base, _LEAD, acks_b)
        assert i == j
        assert acks_a == acks_b
        assert state(msgs) == state(msgs_b)


def test_handled_all_and_stops() -> None:
    """The plain case is handled to the end; each kind of message left to the caller stops the loop."""
    leads = {0: _LEAD + "5 100 60000 3 0 b 0 "}
    for loop in (_native.pop_set_handles, pop_set_handles_py):
        ms = [msg("T", 0, 5, "TAGS\x01a\x02"), msg("T", 0, 6, ""), msg("T", 0, 7, "A\x01B")]
        assert loop(ms, 0, MessageExt, "T", leads) == 3
        assert [m.properties_string for m in ms] == [
            f"TAGS\x01a\x02{_LEAD}5 100 60000 3 0 b 0 5\x02", f"{_LEAD}5 100 60000 3 0 b 0 6\x02",
            f"A\x01B\x02{_LEAD}5 100 60000 3 0 b 0 7\x02"]
        assert msg("T", 0, 7, ms[2].properties_string).properties["POP_CK"] == "5 100 60000 3 0 b 0 7"
        acks = {("T", "5 100 60000 3 0 b 0"): (5, [])}
        scan = _native.pop_ack_scan if loop is _native.pop_set_handles else pop_ack_scan_py
        assert scan(ms, 0, MessageExt, _LEAD, acks) == 3
        assert acks[("T", "5 100 60000 3 0 b 0")][1] == [0, 1, 2]
        for stopper in (msg("U", 0, 8, ""), msg("T", 1, 8, ""), msg("T", 0, 8, "", parsed=True),
                        msg("T", 0, 8, "", cls=Other)):
            assert loop([msg("T", 0, 7, ""), stopper], 0, MessageExt, "T", leads) == 1


INT64 = st.integers(-(2**63), 2**63 - 1)


@settings(max_examples=300, deadline=None)
@given(INT64, st.integers(-3, 40))
def test_offsets_text_same_as_reference(start: int, n: int) -> None:
    stop = max(min(start + n, 2**63 - 1), -(2**63))
    assert _native.offsets_text(start, stop) == offsets_text_py(start, stop) == ",".join(map(str, range(start, stop)))


ITEM = st.one_of(st.integers(-5, 40), st.booleans(), st.floats(0, 40), st.integers(2**62, 2**64), st.text(max_size=2))


@settings(max_examples=500, deadline=None)
@given(st.one_of(st.lists(ITEM, max_size=8), st.integers(-3, 40).flatmap(
    lambda first: st.integers(0, 40).map(lambda n: list(range(first, first + n)))), st.tuples(st.integers())))
def test_int_run_same_as_reference(value: object) -> None:
    assert _native.int_run(value) == int_run_py(value)
    if int_run_py(value):
        assert sorted(set(map(int, value))) == value  # type: ignore[call-overload]


def test_int_run_cases() -> None:
    for run in (_native.int_run, int_run_py):
        assert run([0]) and run([3, 4, 5]) and run([-1, 0, 1]) and run([2**63 - 2, 2**63 - 1])
        assert not run([]) and not run([0, 2]) and not run([1, 0]) and not run([0, 0]) and not run([0, True])
        assert not run([0.0, 1.0]) and not run((0, 1)) and not run([2**63 - 1, 2**63]) and not run("01")


def test_set_handles_offsets_at_the_edges() -> None:
    """Every message handled, with the offsets the C loop writes itself (64-bit, negative) and wider ones, and
    properties of each storage width: the same strings as the reference."""
    leads = {0: _LEAD + "5 100 60000 3 0 b 0 ", 1: _LEAD + "5 100 60000 3 0 b \u00e9 "}
    offsets = [0, 7, 10, 99, 2**31, 2**63 - 1, 2**63, 2**64 + 5, -1, -10, -(2**63), -(2**63) - 1]
    for props in ("", "TAGS\x01a\x02", "A\x01B", "\u00e9\x01x", "\u4e2d\x01\U0001f600"):
        for cls in (MessageExt, Watched):
            a = [msg("T", i % 2, off, props, cls=cls) for i, off in enumerate(offsets)]
            b = copy.deepcopy(a)
            assert _native.pop_set_handles(a, 0, cls, "T", leads) == len(a)
            assert pop_set_handles_py(b, 0, cls, "T", leads) == len(b)
            assert state(a) == state(b)
            assert a[-3].properties_string.endswith(" -10\x02")
