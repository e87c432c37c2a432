"""The frame codec's fast paths write and read exactly what the plain ones did: the JSON header built as
text is byte for byte `json` of the header dict, and frames cut out of reads of any size decode alike."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.remoting import FrameDecoder, RemotingCommand

_reference = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
i32 = st.integers(-(1 << 31), (1 << 31) - 1)
text = st.text(max_size=40)  # any unicode: quotes, backslashes, control characters, astral planes
commands = st.builds(
    RemotingCommand,
    code=i32,
    ext_fields=st.dictionaries(text, text, max_size=8),
    body=st.binary(max_size=64),
    opaque=i32,
    flag=st.integers(0, 3),
    remark=st.none() | text,
    language=st.sampled_from(["JAVA", "PYTHON", "CPP", "NODE"]) | text,
    version=i32,
)


def reference_header(cmd: RemotingCommand) -> bytes:
    """The header as the dict-based encoder wrote it before the fast path."""
    h: dict = {"code": cmd.code, "language": cmd.language, "version": cmd.version, "opaque": cmd.opaque,
               "flag": cmd.flag}
    if cmd.remark is not None:
        h["remark"] = cmd.remark
    if cmd.ext_fields:
        h["extFields"] = cmd.ext_fields
    h["serializeTypeCurrentRPC"] = "JSON"
    return _reference(h).encode("utf-8")


@settings(max_examples=300, deadline=None)
@given(commands)
def test_header_text_is_the_json_of_the_header_dict(cmd: RemotingCommand) -> None:
    assert cmd.header_json() == reference_header(cmd)


@settings(max_examples=100, deadline=None)
@given(st.lists(commands, min_size=1, max_size=6), st.lists(st.integers(1, 97), min_size=1, max_size=30))
def test_frames_decode_alike_whatever_the_reads(cmds: list[RemotingCommand], cuts: list[int]) -> None:
    stream = b"".join(c.encode() for c in cmds)
    whole = FrameDecoder().feed(stream)
    dec, got, pos, i = FrameDecoder(), [], 0, 0
    while pos < len(stream):  # reads of the sizes in `cuts`, over and over
        n = cuts[i % len(cuts)]
        got += dec.feed(stream[pos:pos + n])
        pos, i = pos + n, i + 1
    assert dec.buffered == 0
    for a, b, c in zip(whole, got, cmds, strict=True):
        for x in (a, b):
            assert (x.code, x.opaque, x.flag, x.remark, x.version, x.body) == (c.code, c.opaque, c.flag, c.remark,
                                                                              c.version, c.body)
            assert x.ext_fields == c.ext_fields and x.language == c.language[:16]


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text,
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(text, inner, max_size=4),
                           max_leaves=12)


@given(st.one_of(
    json_values.map(lambda v: json.dumps(v, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    st.tuples(st.dictionaries(text, json_values, max_size=4), st.sampled_from(["", " ", "\n\t", " x", "}", "{"]))
      .map(lambda t: (json.dumps(t[0]) + t[1]).encode()),
    st.binary(max_size=40).map(lambda b: b"{" + b),  # broken JSON, broken UTF-8
))
@settings(max_examples=400)
def test_header_json_is_read_as_json_loads_reads_it(data: bytes) -> None:
    """The header reader's direct use of json's C scanner gives json.loads' result, or fails where it fails."""
    from rmq_eventstore.remoting.command import _loads_header

    try:
        want: object = ("ok", json.loads(data))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        want = ("error", type(e))
    try:
        got: object = ("ok", _loads_header(data))
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        got = ("error", type(e))
    assert got == want
