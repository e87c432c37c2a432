"""The client's half message in C (`_native.client_send_frame` with the half's text and flag, as
`TransactionProducer._prepare_plain` calls it): the request frame is byte for byte the one `prepare`'s general path (`_properties`, TRAN_MSG and PGROUP set, the PREPARED
sysFlag, `_send`'s header, `RemotingCommand.encode_py`) writes, anything else is declined; against a real broker
the fast path's result is the general path's, `while_waiting` runs once after the request is written, and a
failed connection ends as the general path ends it."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker.server import RunningBroker
from rmq_eventstore.client import Message, PullConsumer, TransactionProducer, TransactionState
from rmq_eventstore.client import transaction_producer as tp_mod
from rmq_eventstore.common import codec
from rmq_eventstore.common.topic import RMQ_SYS_TRANS_HALF_TOPIC
from rmq_eventstore.remoting import FrameDecoder
from tests.conftest import SMALL_GEOMETRY
from tests.test_client_send_native import _Capture, messages, native, texts


class _Routed(_Capture):
    """`_Capture` with a route of one queue `q` (what `_send`'s `_pick` reads)."""

    def __init__(self, q: int) -> None:
        super().__init__()
        self.q = q

    def route(self, topic: str, refresh: bool = False) -> SimpleNamespace:
        return SimpleNamespace(queues=[("127.0.0.1:1", self.q)])


def reference_half_frame(msg: Message, uniq: str, group: str, q: int, opaque: int, born: int) -> bytes:
    """The frame `TransactionProducer.prepare`'s general path sends for `msg` (UNIQ_KEY `uniq`, queue `q`), with
    this opaque and born timestamp, encoded by the Python codec. (`_Routed` is no ClientBase: `prepare` takes its
    general path.)"""
    p = TransactionProducer.__new__(TransactionProducer)
    p.group = group
    p._base = _Routed(q)  # type: ignore[assignment]
    p.retry_times_when_send_failed = 0
    p._rr = itertools.count()
    p._valid_topics = set()
    p._ids = SimpleNamespace(create=lambda: uniq)  # type: ignore[assignment]
    p.prepare(msg)
    (cmd,) = p._base.sent  # type: ignore[attr-defined]
    cmd.opaque = opaque
    cmd.ext_fields["g"] = str(born)
    return cmd.encode_py()


def half_frame(msg: Message, uniq: str, group: str, q: int, opaque: int, born: int) -> bytes | None:
    """What `_prepare_plain` asks C for (None where `prepare` does not ask: a TRAN_MSG or PGROUP property given)."""
    if isinstance(msg.properties, dict) and ("TRAN_MSG" in msg.properties or "PGROUP" in msg.properties):
        return None
    try:
        sys_flag = (msg.sys_flag & ~codec.TRANSACTION_ROLLBACK_TYPE) | codec.TRANSACTION_PREPARED_TYPE
    except TypeError:  # prepare raises before anything is sent
        return None
    return native.client_send_frame(msg, uniq, group, q, opaque, born, f"TRAN_MSG\x01true\x02PGROUP\x01{group}\x02",
                                    sys_flag)


@settings(max_examples=400, deadline=None)
@given(msg=messages, uniq=st.sampled_from(["0A0B0C0D", "é"]), group=texts, q=st.integers(0, 1 << 40),
       opaque=st.integers(0, 0x7FFFFFFF), born=st.integers(0, 1 << 45),
       extra=st.sampled_from([None, {"TRAN_MSG": "x"}, {"PGROUP": "other"}, {"xTRAN_MSG": "y", "k": "PGROUP\x01"}]))
def test_the_half_frame_is_the_general_paths_frame(msg: Message, uniq: str, group: str, q: int, opaque: int,
                                                   born: int, extra: dict[str, str] | None) -> None:
    if extra is not None and (msg.properties is None or isinstance(msg.properties, dict)):
        msg.properties = {**(msg.properties or {}), **extra}
    got = half_frame(msg, msg.uniq_key or uniq, group, q, opaque, born)
    try:
        want = reference_half_frame(msg, uniq, group, q, opaque, born)
    except (TypeError, UnicodeEncodeError, ValueError):  # the general path refuses it: C must have declined
        assert got is None
        return
    assert got is None or got == want


def test_the_half_frame_covers_the_usual_shapes() -> None:
    cases = [Message("T", b"x"), Message("T", b"", tags="t", keys="k1 k2"),
             Message("T", b'{"type":"OrderPlaced"}', tags="Placed", keys=["n1"], uniq_key="AB12",
                     properties={"DJANGO_DB": "default", "STREAM_TX_GROUP": "g-1"}),
             Message("T", b"b", sys_flag=0xC | 1, flag=-5, reconsume_times=3, tags="é\"\\\n"),
             Message("T", b"x", sys_flag=True)]  # (True & ~0xC) | 4: an int, both ways
    for m in cases:
        uniq = m.uniq_key or "0A0B"
        got = half_frame(m, uniq, "grp", 2, 99, 1700000000123)
        assert got == reference_half_frame(m, uniq, "grp", 2, 99, 1700000000123), m
        (cmd,) = FrameDecoder().feed(got)
        assert cmd.ext_fields["i"].endswith("TRAN_MSG\x01true\x02PGROUP\x01grp\x02")
        assert int(cmd.ext_fields["f"]) & 0xC == 4
    for odd in (Message("T", b"x", properties={"TRAN_MSG": "false"}), Message("T", b"x", properties={"PGROUP": "g"}),
                Message("T", b"x", properties_string="a\x01b\x02"), Message("T", bytearray(b"x")),
                Message("T", b"x", sys_flag=1 << 64)):
        assert half_frame(odd, "0A0B", "grp", 2, 99, 1) is None, odd


def _stored_half(running, offset_msg_id: str):  # noqa: ANN001, ANN202
    from rmq_eventstore.common import codec

    return running.store.look_message_by_offset(codec.decode_message_id(offset_msg_id)[2])


def test_prepare_on_the_fast_path_answers_and_stores_what_the_general_path_does(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic("HalfT", 4, 4)
        with TransactionProducer(running.namesrv_address, "hg", lambda h: TransactionState.COMMIT) as tp:
            tp.send_in_transaction(Message("HalfT", b"route"), lambda m: TransactionState.ROLLBACK)  # route cached
            events: list[str] = []
            fast = tp.prepare(Message("HalfT", b"fast", tags="t", keys=["k1"], properties={"DJANGO_DB": "default"}),
                              while_waiting=lambda: events.append("w"))
            events.append("answered")
            plain = tp.prepare(Message("HalfT", b"plain", tags="t", keys=["k1"]))
            # the general path: a properties_string given (C declines: set_property's path), same properties
            general = tp.prepare(Message("HalfT", b"general", tags="t", keys=["k1"],
                                         properties_string="TAGS\x01t\x02KEYS\x01k1\x02DJANGO_DB\x01default\x02"))
            assert events == ["w", "answered"]
            for s in (fast, plain, general):
                assert s.status == "SEND_OK" and s.transaction_id == s.msg_id and s.offset_msg_id
                assert s.local_transaction_state is TransactionState.UNKNOWN and s.topic == "HalfT"
            running.store.reput_message_service.wait_for()
            a, c = _stored_half(running, fast.offset_msg_id), _stored_half(running, general.offset_msg_id)
            assert a.topic == c.topic == RMQ_SYS_TRANS_HALF_TOPIC and a.sys_flag == c.sys_flag
            pa, pc = dict(a.properties), dict(c.properties)
            for k in ("UNIQ_KEY", "REAL_QID", "__CRC32#"):  # each message's own (the id, its queue, the trailer)
                pa.pop(k, None), pc.pop(k, None)
            assert pa == pc and pa["PGROUP"] == "hg" and pa["TRAN_MSG"] == "true"
            assert a.properties["UNIQ_KEY"] == fast.transaction_id
            assert int(a.properties["REAL_QID"]) == fast.queue_id
            for s, state in ((fast, TransactionState.COMMIT), (plain, TransactionState.COMMIT),
                             (general, TransactionState.ROLLBACK)):
                tp.end_transaction(s, state)


def test_a_failed_connection_goes_on_in_the_general_path_with_while_waiting_once(tmp_path: Path) -> None:
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic("HalfT", 4, 4)
        with TransactionProducer(running.namesrv_address, "hg", lambda h: TransactionState.COMMIT) as tp:
            tp.send_in_transaction(Message("HalfT", b"route"), lambda m: TransactionState.ROLLBACK)
            brokers = {addr for addr, _q in tp._base.route("HalfT").queues}
            assert brokers and running.namesrv_address not in brokers
            for addr in brokers:
                tp._base.remoting._conns[addr].sock.close()  # the next write fails: the request was not written
            calls: list[int] = []
            sent = tp.prepare(Message("HalfT", b"again"), while_waiting=lambda: calls.append(1))
            assert sent.status == "SEND_OK" and calls == [1]
            tp.end_transaction(sent, TransactionState.COMMIT)


def test_without_the_native_core_prepare_takes_the_general_path() -> None:
    from rmq_eventstore.client import producer as producer_mod

    assert tp_mod._send_frame is producer_mod._send_frame
    assert (tp_mod._send_frame is None) == (codec.native is None or not hasattr(codec.native, "client_send_frame"))


def test_the_end_header_is_the_one_a_boolean_made(tmp_path: Path) -> None:
    """`_end_at` writes fromTransactionCheck as its text (so the C request builder takes the header): the same
    extFields, in the same order, as the boolean gave through `_ext_strings`."""
    from rmq_eventstore.remoting import RemotingCommand, RequestCode

    for from_check in (False, True):
        header = {"topic": "T", "producerGroup": "g", "tranStateTableOffset": 3, "commitLogOffset": 1 << 40,
                  "commitOrRollback": 8, "fromTransactionCheck": from_check, "msgId": "ID", "transactionId": "ID"}
        as_text = {**header, "fromTransactionCheck": "true" if from_check else "false"}
        want = RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True)
        got = RemotingCommand.request(RequestCode.END_TRANSACTION, as_text, oneway=True)
        assert list(got.ext_fields.items()) == list(want.ext_fields.items())
        got.opaque = want.opaque
        assert got.encode() == want.encode()
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL_GEOMETRY) as running:
        running.broker.create_topic("HalfT", 4, 4)
        with TransactionProducer(running.namesrv_address, "hg", lambda h: TransactionState.COMMIT) as tp:
            s = tp.send_in_transaction(Message("HalfT", b"ended"), lambda m: TransactionState.COMMIT)
            assert s.local_transaction_state is TransactionState.COMMIT
            for _ in range(100):  # the END is one-way
                if running.broker.transaction_service.known_end(s.transaction_id) == "COMMIT":
                    break
                time.sleep(0.02)
            assert running.broker.transaction_service.known_end(s.transaction_id) == "COMMIT"


@pytest.fixture
def tx_fast_path(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The half message's C frame on, each frame it makes recorded."""
    made: list[bytes] = []

    def frame(*args: object) -> bytes | None:
        got = native.client_send_frame(*args)
        if got is not None:
            made.append(got)
        return got

    monkeypatch.setattr(tp_mod, "_send_frame", frame)
    monkeypatch.setattr(tp_mod, "_send_take", native.client_send_take)
    return made


def _halves(broker: RunningBroker, expect: int) -> dict[str, dict[str, str]]:
    """UNIQ_KEY -> the stored properties of every half message, once `expect` of them are readable (up to 10 s:
    see `_read_all`)."""
    deadline = time.monotonic() + 10
    while True:
        out: dict[str, dict[str, str]] = {}
        with PullConsumer(broker.namesrv_address, "cg-half") as c:
            r = c.pull("RMQ_SYS_TRANS_HALF_TOPIC", 0, 0, max_nums=64, suspend_timeout_ms=0)
            for m in r.messages:
                out[m.properties["UNIQ_KEY"]] = m.properties
        if len(out) >= expect or time.monotonic() > deadline:
            return out
        time.sleep(0.05)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", mapped_file_size_commit_log=1 << 20, max_message_size=64 * 1024)
    yield rb
    rb.close()


def test_a_half_message_the_c_frame_does_not_cover_goes_the_general_way(
        broker: RunningBroker, tx_fast_path: list[bytes]) -> None:
    checker = lambda half: TransactionState.UNKNOWN  # noqa: E731
    with TransactionProducer(broker.namesrv_address, "txg", checker) as p:
        p.prepare(Message("Odd", b"warm"))
        made = len(tx_fast_path)
        odd = [p.prepare(Message("Odd", b"x", properties={"PGROUP": "other"})),  # set_property moves it
               p.prepare(Message("Odd", b"x", tags=7)),  # type: ignore[arg-type]  # the C frame declines
               p.prepare(Message("Odd", b"x"), stream="s-1")]  # a stream's header
        assert len(tx_fast_path) == made
        assert all(r.status == "SEND_OK" for r in odd)
    halves = _halves(broker, 4)
    assert halves[odd[0].transaction_id]["PGROUP"] == "txg" and halves[odd[1].transaction_id]["TAGS"] == "7"
