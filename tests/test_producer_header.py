"""`Producer._send` builds a send's header with its values as strings already (no conversion pass in
`RemotingCommand.request`): the frame must be byte for byte the one `request()` makes of the header with
its ints and booleans, for plain ints and for the odd values that go through `request()` itself."""

from __future__ import annotations

import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmq_eventstore.client.producer import Producer
from rmq_eventstore.common import Message, codec
from rmq_eventstore.common.topic import AUTO_CREATE_TOPIC_KEY_TOPIC, TopicValidationError
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode


class _Base:
    timeout = 3.0

    def __init__(self) -> None:
        self.sent: list[RemotingCommand] = []

    def invoke(self, addr: str, cmd: RemotingCommand, timeout: float, ok: tuple = (), while_waiting=None):  # noqa: ANN001, ANN201
        self.sent.append(cmd)
        return RemotingCommand(ResponseCode.SUCCESS, {"msgId": "M", "queueId": "1", "queueOffset": "5",
                                                      "streamVersion": "3"}, b"", cmd.opaque, 1)

    def supports(self, addr: str, ext: str) -> bool:
        return True


def _producer() -> Producer:
    p = Producer.__new__(Producer)
    p.group = "grp"
    p._base = _Base()  # type: ignore[assignment]
    p.retry_times_when_send_failed = 0
    p._pick = types.MethodType(lambda self, topic, q, avoid: ("127.0.0.1:1", 3 if q is None else q), p)  # type: ignore[method-assign]
    return p


ints = st.integers(-(1 << 40), 1 << 40)


@settings(max_examples=200, deadline=None)
@given(flag=ints | st.booleans(), sys_flag=ints | st.booleans(), reconsume=ints | st.booleans(),
       queue_id=st.none() | st.integers(0, 7), batch=st.booleans(), stream=st.none() | st.sampled_from(["s-1", "acc"]),
       expected=st.none() | st.integers(0, 1 << 40) | st.booleans(), props=st.text(max_size=20))
def test_send_header_is_what_request_makes(flag, sys_flag, reconsume, queue_id, batch, stream, expected,  # noqa: ANN001
                                           props) -> None:  # noqa: ANN001
    if stream is None:
        expected = None
    p = _producer()
    if stream is not None and queue_id is None:
        queue_id = 0
    try:
        p._send("Topic", queue_id, RequestCode.SEND_MESSAGE_V2, b"body", props, flag, sys_flag, reconsume, "ID",
                batch, None, stream, expected)
    except ValueError:  # a negative expected version: refused before anything is sent
        assert expected is not None and expected < 0
        return
    (cmd,) = p._base.sent  # type: ignore[attr-defined]
    ext = {"a": "grp", "b": "Topic", "c": AUTO_CREATE_TOPIC_KEY_TOPIC, "d": 4, "e": 3 if queue_id is None else queue_id,
           "f": sys_flag, "g": int(cmd.ext_fields["g"]), "h": flag, "i": props, "j": reconsume, "k": False}
    if batch:
        ext["m"] = True
    if stream is not None:
        ext["streamId"] = stream
        if expected is not None:
            ext["expectedVersion"] = expected
    want = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE if batch else RequestCode.SEND_MESSAGE_V2, ext,
                                   b"body")
    want.opaque = cmd.opaque
    assert cmd.encode_py() == want.encode_py()
    assert cmd.encode() == want.encode_py()


def test_a_plain_send_skips_the_conversion(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plain case really is the direct one (what the test above compares is both paths)."""
    called = []
    real = RemotingCommand.request.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(RemotingCommand, "request", classmethod(lambda cls, *a, **k: called.append(1) or real(cls, *a, **k)))
    p = _producer()
    p._send("Topic", None, RequestCode.SEND_MESSAGE_V2, b"b", "", 0, 0, 0, "ID", False, None)
    assert called == []
    p._send("Topic", None, RequestCode.SEND_MESSAGE_V2, b"b", "", True, 0, 0, "ID", False, None)
    assert called == [1]


def test_send_validates_each_topic_once_and_refuses_bad_ones_every_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from rmq_eventstore.client import producer as producer_mod

    checked: list[object] = []
    real = producer_mod.validate_topic
    monkeypatch.setattr(producer_mod, "validate_topic", lambda t: checked.append(t) or real(t))
    p = _producer()
    p._ids = codec.UniqueIdGenerator()
    p._valid_topics = set()
    for _ in range(3):
        assert p.send(Message("Topic", b"x")).status == "SEND_OK"
        with pytest.raises(TopicValidationError):
            p.send(Message("bad topic!", b"x"))
    assert checked == ["Topic", "bad topic!", "bad topic!", "bad topic!"]
    monkeypatch.setattr(producer_mod, "_VALID_TOPICS_MAX", 2)
    for t in ("A", "B", "C", "A"):
        p.send(Message(t, b"x"))
    assert checked[4:] == ["A", "B", "C", "A"]  # forgotten when the set filled up, then validated again
