"""The C frame codec (`rmq_eventstore._native`'s remoting block) writes and reads exactly what the Python
codec in `remoting/command.py` does: the same frame bytes for any command, and for any bytes on a
connection the same commands (every field, with its type) or the same error. Runs whether or not
`RMQ_EVENTSTORE_PURE` is set: the extension is loaded here directly."""

from __future__ import annotations

import json
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmq_eventstore.remoting import FrameDecoder, FrameError, RemotingCommand, RequestCode, SerializeType
from rmq_eventstore.remoting import command as command_mod
from tests.conftest import import_native

_REQUIRED = os.environ.get("RMQ_EVENTSTORE_REQUIRE_NATIVE", "0") not in ("", "0")
_PURE = os.environ.get("RMQ_EVENTSTORE_PURE", "0") not in ("", "0")
_native = import_native()
if not hasattr(_native, "remoting_decode"):
    if _REQUIRED:
        raise AssertionError("RMQ_EVENTSTORE_REQUIRE_NATIVE is set but the extension predates the remoting codec")
    pytest.skip("the native extension predates the remoting codec; `make native` rebuilds it", allow_module_level=True)
_native.remoting_init(RemotingCommand, SerializeType.JSON)


def test_the_codec_in_use() -> None:
    """The C codec serves unless RMQ_EVENTSTORE_PURE is set (then the Python one, which these tests still
    compare with the C one loaded here directly)."""
    assert command_mod.NATIVE == (not _PURE)
    assert (command_mod._native_encode is None) == _PURE and (command_mod._native_decode is None) == _PURE

i32 = st.integers(-(1 << 31), (1 << 31) - 1)
wide_int = st.integers(-(1 << 70), 1 << 70)
text = st.text(max_size=30)  # any unicode: quotes, backslashes, control characters, lone surrogates
odd = st.one_of(st.none(), st.booleans(), wide_int, st.floats(allow_nan=False), st.binary(max_size=4), text)
commands = st.builds(
    RemotingCommand,
    code=st.one_of(i32, wide_int, st.sampled_from(list(RequestCode)), st.booleans()),
    ext_fields=st.one_of(st.dictionaries(text, text, max_size=8), st.dictionaries(text, odd, max_size=3),
                         st.dictionaries(st.integers(), text, max_size=2)),
    body=st.one_of(st.binary(max_size=64), st.just(b""), st.none(), st.binary(max_size=8).map(bytearray)),
    opaque=i32,
    flag=st.integers(0, 3),
    remark=st.none() | text | st.integers(),
    language=st.sampled_from(["JAVA", "PYTHON", "CPP", "NODE"]) | text,
    version=st.one_of(i32, st.floats(allow_nan=False, max_value=10, min_value=-10)),
)


def _outcome(f):  # type: ignore[no-untyped-def]
    try:
        return "ok", f()
    except Exception as e:  # noqa: BLE001 - the same exception, whatever it is
        return "error", type(e), str(e)


@settings(max_examples=600, deadline=None)
@given(commands)
def test_encode_writes_the_python_frame(cmd: RemotingCommand) -> None:
    frame = _native.remoting_encode(cmd)
    want = _outcome(cmd.encode_py)
    if frame is None:  # given way: the Python code decides (and may raise)
        return
    assert want == ("ok", frame)


def test_encode_handles_the_plain_shapes() -> None:
    """What every request and response is: the C encoder writes it (it does not give way)."""
    cmds = [RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g", "b": "T", "e": 3, "i": "K\x01v\x02é"},
                                    b"body"),
            RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "T", "queueId": 0}),
            RemotingCommand(0, {"msgId": "X"}, b"", 5, 1, "ok \"quoted\" \\ \n", "JAVA", 435)]
    cmds.append(cmds[0].response(remark="fine", ext_fields={"queueOffset": 7}))
    for c in cmds:
        assert _native.remoting_encode(c) == c.encode_py()


def test_encode_writes_the_edge_integers_and_escapes() -> None:
    """The C encoder's digits (by hand, not snprintf) at the ends of the 64-bit range and around powers of
    ten, and its escapes at the start, middle and end of a string and in runs."""
    for v in (0, -1, 1, 9, 10, -10, 99, 100, 2**31 - 1, -2**31, 2**63 - 1, -2**63, 10**18, -10**18):
        c = RemotingCommand(v, {}, b"", v, 0, None, "JAVA", v)
        assert _native.remoting_encode(c) == c.encode_py(), v
    for s in ("", "\x01", "a\x01", "\x01a", "\x01\x02", '""', "\\\\", "a\tb\nc\rd\be\ff", "\x7f\x1f é\x00",
              "UNIQ_KEY\x01ABC\x02WAIT\x01true\x02" * 20):
        c = RemotingCommand(1, {s: s}, b"", 1, 0, s)
        assert _native.remoting_encode(c) == c.encode_py(), s


def test_encode_gives_way_for_an_int_that_formats_itself() -> None:
    """`{code:d}` of an int subclass with its own __format__ is not int's digits: Python writes it."""

    class Odd(int):
        def __format__(self, spec: str) -> str:
            return "7"

    cmd = RemotingCommand(Odd(3), {}, b"", 1)
    assert _native.remoting_encode(cmd) is None
    assert cmd.encode() == cmd.encode_py() and b'"code":7' in cmd.encode()
    assert _native.remoting_encode(RemotingCommand(True, {}, b"", 1)) == RemotingCommand(True, {}, b"", 1).encode_py()


def _py_feed(max_frame: int, max_header: int, chunks: list[bytes]):  # type: ignore[no-untyped-def]
    saved = command_mod._native_decode
    command_mod._native_decode = None
    try:
        return _feed(max_frame, max_header, chunks)
    finally:
        command_mod._native_decode = saved


def _c_feed(max_frame: int, max_header: int, chunks: list[bytes]):  # type: ignore[no-untyped-def]
    saved = command_mod._native_decode
    command_mod._native_decode = _native.remoting_decode
    try:
        return _feed(max_frame, max_header, chunks)
    finally:
        command_mod._native_decode = saved


def _fields(c: RemotingCommand) -> tuple:
    vals = tuple(getattr(c, s) for s in RemotingCommand.__slots__)
    ext = tuple((type(k), k, type(v), v) for k, v in c.ext_fields.items())
    return vals, tuple(type(v) for v in vals), ext


def _feed(max_frame: int, max_header: int, chunks: list[bytes]):  # type: ignore[no-untyped-def]
    dec = FrameDecoder(max_frame, max_header)
    out = []
    for ch in chunks:
        try:
            out.append(("ok", [_fields(c) for c in dec.feed(ch)], dec.buffered))
        except FrameError as e:
            out.append(("error", str(e)))
            break
    return out


def _frame(header: bytes, body: bytes = b"", stype: int = 0) -> bytes:
    return struct.pack(">ii", 4 + len(header) + len(body), (stype << 24) | len(header)) + header + body


json_scalars = st.one_of(st.none(), st.booleans(), wide_int, st.floats(allow_nan=False), text)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(text, inner, max_size=3), max_leaves=6)
known = st.sampled_from(["code", "opaque", "flag", "version", "language", "remark", "extFields",
                         "serializeTypeCurrentRPC", "co\\u0064e"])
header_dicts = st.dictionaries(known | text, st.one_of(
    i32, json_values, st.dictionaries(text, text | json_scalars, max_size=4)), max_size=8)


def _dump(d: dict, style: int) -> bytes:
    if style == 0:
        s = json.dumps(d, ensure_ascii=False, separators=(",", ":"))
    elif style == 1:
        s = json.dumps(d, ensure_ascii=True, indent=1)
    else:
        s = json.dumps(d, ensure_ascii=False)
    return s.encode("utf-8", "surrogatepass")


headers = st.one_of(
    st.builds(_dump, header_dicts, st.integers(0, 2)),
    st.builds(lambda d, j, k: _dump(d, 0).replace(b"\\u00", j, k), header_dicts,
              st.sampled_from([b"\\u00", b"\\U00", b"\\u0", b"\\"]), st.integers(0, 2)),
    commands.map(lambda c: c.header_json() if _outcome(c.encode_py)[0] == "ok" else b"{}"),
    st.binary(max_size=40).map(lambda b: b'{"code":1,' + b),  # broken JSON, broken UTF-8
    st.builds(lambda a, b: a + b, st.sampled_from([b'{"code":1}', b'{"code":-0}', b'{"code":01}', b' {"code":1}',
                                                   b'{"code":1.0}', b'{"code":1e2}', b'{"code":true}']),
              st.sampled_from([b"", b" ", b"\n", b"x", b"}"])),
)


@settings(max_examples=800, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(headers, st.binary(max_size=16), st.sampled_from([0, 0, 0, 1, 2])), min_size=1,
                max_size=4),
       st.lists(st.integers(1, 80), min_size=1, max_size=6), st.sampled_from([(1 << 24, 1 << 20), (200, 120)]))
def test_decode_reads_what_python_reads(frames: list, cuts: list[int], limits: tuple[int, int]) -> None:
    stream = b"".join(_frame(h, b, t) for h, b, t in frames)
    chunks, pos, i = [], 0, 0
    while pos < len(stream):
        chunks.append(stream[pos:pos + cuts[i % len(cuts)]])
        pos, i = pos + cuts[i % len(cuts)], i + 1
    for parts in ([stream], chunks):
        assert _c_feed(*limits, parts) == _py_feed(*limits, parts)


def test_decode_takes_the_plain_frames_in_c() -> None:
    """Headers as Java and our encoder write them are decoded by C (nothing left to the Python loop)."""
    reqs = [RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"b": "T", "i": "K\x01v\x02\U0001f600"}, b"x"),
            RemotingCommand(0, {}, b"", 1, 1, None, "JAVA", 435)]
    java = (b'{"code":0,"extFields":{"msgId":"7F00","queueId":"1"},"flag":1,"language":"JAVA","opaque":9,'
            b'"serializeTypeCurrentRPC":"JSON","version":435}')
    stream = b"".join(c.encode_py() for c in reqs) + _frame(java)
    got, pos = _native.remoting_decode(stream, 0, 1 << 24, 1 << 20)
    assert pos == len(stream) and len(got) == 3
    assert got[0].ext_fields == {"b": "T", "i": "K\x01v\x02\U0001f600"} and got[0].body == b"x"
    assert (got[2].code, got[2].opaque, got[2].flag, got[2].language, got[2].version) == (0, 9, 1, "JAVA", 435)
    assert got[2].ext_fields == {"msgId": "7F00", "queueId": "1"} and got[2].remark is None
    assert got[2].serialize_type is SerializeType.JSON


def test_decode_gives_way_before_a_binary_header() -> None:
    stream = _frame(b'{"code":3}') + _frame(b"\x00" * 17, stype=1)
    got, pos = _native.remoting_decode(stream, 0, 1 << 24, 1 << 20)
    assert len(got) == 1 and pos == len(_frame(b'{"code":3}'))


def test_decode_reads_what_python_reads_on_mutated_frames() -> None:
    """Real frames with bytes changed, inserted or removed (JSON punctuation, escapes, NUL, broken UTF-8):
    C and Python agree on every one (seeded: 3,000 of them)."""
    import random

    rnd = random.Random(7)
    base = [RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {"a": "g", "i": "K\x01v\x02é\U0001f600", "e": 3},
                                    b"xyz").encode_py(),
            RemotingCommand(0, {"k": "v"}, b"", 1, 1, 'remark "q"', "JAVA", 435).encode_py(),
            _frame(rb'{"code":1,"remark":"\ud83d\ude00\u0001","extFields":{"a\n":"\u00e9"},"x":null,"y":-12}')]
    alphabet = b'{}[]":,\\u0123456789abcdefABCDEFtruefalsenull \n\x00\x01\xed\xa0\x80\xff.eE-+'
    for _ in range(3000):
        s = bytearray(rnd.choice(base))
        for _ in range(rnd.randint(1, 4)):
            k = rnd.randrange(len(s))
            op = rnd.random()
            if op < 0.6:
                s[k] = rnd.choice(alphabet)
            elif op < 0.8:
                s.insert(k, rnd.choice(alphabet))
            else:
                del s[k]
        assert _c_feed(1 << 24, 1 << 20, [bytes(s)]) == _py_feed(1 << 24, 1 << 20, [bytes(s)])
