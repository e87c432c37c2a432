"""The JSON codec's direct paths against the calls they stand for: `JSONCodec.encode` against
``DjangoJSONEncoder.encode`` (the same text, the same errors), `JSONCodec.decode` against ``json.loads`` of the
bytes (the same value, None where that raises), and the marker insert's parameters written out against the
general conversion."""

from __future__ import annotations

import codecs
import datetime
import decimal
import json
import threading
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.django import marker
from rmq_eventstore.django.models import JSONCodec

CODEC = JSONCodec()


def ref_encode(data: Any) -> bytes:
    return JSONCodec._encoder.encode(data).encode()


def ref_decode(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return None


def outcome(f: Any, *args: Any) -> Any:
    try:
        return ("ok", f(*args))
    except Exception as e:  # noqa: BLE001 - compared by type and text
        return ("error", type(e), str(e))


scalars = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
           | st.text() | st.datetimes() | st.dates() | st.times() | st.decimals(allow_nan=False)
           | st.uuids() | st.timedeltas())
keys = st.text() | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
                      | st.dictionaries(keys, inner, max_size=4), max_leaves=12)


@given(values)
@settings(max_examples=400, deadline=None)
def test_encode_is_the_encoders_text(v: Any) -> None:
    assert outcome(CODEC.encode, v) == outcome(ref_encode, v)


def test_encode_special_values_and_errors() -> None:
    tz = datetime.timezone(datetime.timedelta(hours=2))
    for v in ["", "é\u2028\x00", {"a": [1, 2.5, None, True]}, [float("nan"), float("inf")],
              {"t": datetime.datetime(2026, 11, 26, 12, 0, 0, 123456, tzinfo=tz)}, decimal.Decimal("1.10"),
              uuid.UUID(int=5), {1: "x", None: 2, 1.5: 3, False: 4}, (1, 2), 7, None, 1e300]:
        assert CODEC.encode(v) == ref_encode(v), v
    circular: list = []
    circular.append(circular)
    assert outcome(CODEC.encode, circular) == outcome(ref_encode, circular)
    assert outcome(CODEC.encode, {"x": object()})[:2] == outcome(ref_encode, {"x": object()})[:2]
    assert outcome(CODEC.encode, {(1, 2): 3}) == outcome(ref_encode, {(1, 2): 3})


def test_encode_in_threads_checks_circularity_per_call() -> None:
    shared = {"a": [1, 2, {"b": "c"}] * 50}
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(2000):
                assert CODEC.encode(shared) == ref_encode(shared)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


@given(st.binary(max_size=12) | values.map(lambda v: ref_encode(v) if outcome(ref_encode, v)[0] == "ok" else b"")
       | st.tuples(st.sampled_from(["utf-8", "utf-8-sig", "utf-16", "utf-16-le", "utf-16-be", "utf-32",
                                    "utf-32-le", "utf-32-be"]), st.text(max_size=6) | st.sampled_from(
                                        ['"x"', "[1, 2]", '{"a": 1}', " 3 ", "\ufeff1", "\x00", "nul"]))
       .map(lambda t: t[1].encode(t[0], "surrogatepass")))
@settings(max_examples=600, deadline=None)
def test_decode_is_json_loads_of_the_bytes(body: bytes) -> None:
    got, want = CODEC.decode(body), ref_decode(body)
    assert type(got) is type(want) and json.dumps(got, sort_keys=True, default=repr) == json.dumps(
        want, sort_keys=True, default=repr)


def test_decode_edges() -> None:
    for body in [b"", b"1", b"12", b"123", b"\x001", b"1\x00", b"1\x002", codecs.BOM_UTF8 + b"1",
                 codecs.BOM_UTF16_LE + "1".encode("utf-16-le"), "[1]".encode("utf-32-be"), b'"\xed\xa0\x80"',
                 b'"\xff"', b"\xc3\xa9", b'{"a": NaN}', b"[1,2]  ", b" [1,2]"]:
        got, want = CODEC.decode(body), ref_decode(body)
        assert repr(got) == repr(want), body


class _PgConn:
    transaction_status = marker._INTRANS

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def exec_params(self, text: bytes, params: list) -> Any:
        self.calls.append((text, params))
        return type("R", (), {"status": marker._COMMAND_OK})()


class _Raw:
    def __init__(self) -> None:
        self.pgconn = _PgConn()
        self.lock = threading.Lock()


class _Conn:
    vendor = "postgresql"
    queries_logged = False
    execute_wrappers: list = []

    def __init__(self) -> None:
        self.connection = _Raw()


@pytest.mark.skipif(marker._INTRANS is None, reason="psycopg 3 is not installed")
def test_marker_parameters_written_out_are_the_general_ones() -> None:
    class S(str):
        def __str__(self) -> str:
            return "other"

    when = datetime.datetime(2026, 11, 26, 12, 0, 0, 5, tzinfo=datetime.UTC)
    sql = "INSERT INTO t (a, b, c, d, e) VALUES (%s, %s, %s, %s, %s)"
    for values in [("tx-1", "default", "topic-é", "C", when), ("tx-2", "a", "b", "R", when.replace(tzinfo=None)),
                   ("tx-3", S("x"), "b", "C", when), ("tx-4", "a", "b", "C", "2026-11-26 12:00:00"),
                   ("tx-5", None, "b", "C", when), ("tx-6", "a", 3, "C", when)]:
        conn = _Conn()
        assert marker._insert_on_pgconn(conn, sql, values)
        ((text, params),) = conn.connection.pgconn.calls
        general = [None if v is None else (v.isoformat() if v.__class__ is datetime.datetime else str(v)).encode()
                   for v in values]
        assert params == general and text.endswith(b"($1, $2, $3, $4, $5)"), values
    conn = _Conn()
    assert marker._insert_on_pgconn(conn, "INSERT INTO t (a) VALUES (%s)", ("x",))
    assert conn.connection.pgconn.calls[0][1] == [b"x"]
