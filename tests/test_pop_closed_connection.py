"""A POP long poll whose client has gone: the broker pops nothing more for it, and what it popped for it
after all (the connection closed between the pop and the answer) is given back at once, not left invisible
for its invisible time. RocketMQ's PopLongPollingService skips requests of inactive channels likewise.

Over a real broker on loopback: the held POP is a raw remoting frame on a socket the test closes."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.broker.processor.pop import PopMessageProcessor, give_back_popped
from rmq_eventstore.client import Message, PopConsumer, Producer
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
INVISIBLE = 60_000  # the invisible time of the abandoned POPs: far longer than the test waits


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    with serve_in_thread(tmp_path / "store", **SMALL) as rb:
        yield rb


def _prepare(rb: RunningBroker) -> None:
    """Topic `tasks` and group `workers` exist, and the group has consumed all there is."""
    with Producer(rb.namesrv_address, "p") as p:
        p.send(Message("tasks", b"warm-up"))
    rb.store.wait_for_dispatch()
    with PopConsumer(rb.namesrv_address, "workers") as c:
        got = c.pop("tasks", invisible_time=10_000, poll_time=2000)
        assert [m.body for m in got] == [b"warm-up"]
        c.ack(got[0])


def _pop_request(poll_ms: int) -> RemotingCommand:
    return RemotingCommand.request(RequestCode.POP_MESSAGE, {
        "consumerGroup": "workers", "topic": "tasks", "queueId": -1, "maxMsgNums": 32, "invisibleTime": INVISIBLE,
        "pollTime": poll_ms, "bornTime": 0, "initMode": 1, "expType": "TAG", "exp": "*", "order": False})


def _pop_within(rb: RunningBroker, seconds: float) -> tuple[list, float]:
    t0 = time.monotonic()
    got: list = []
    with PopConsumer(rb.namesrv_address, "workers") as c:
        while not got and time.monotonic() - t0 < seconds:
            got = c.pop("tasks", invisible_time=INVISIBLE, poll_time=500)
        for m in got:
            c.ack(m)
    return got, time.monotonic() - t0


def test_a_long_poll_whose_client_closed_pops_nothing(broker: RunningBroker) -> None:
    _prepare(broker)
    host, port = broker.broker_address.rsplit(":", 1)
    s = socket.create_connection((host, int(port)))
    s.sendall(_pop_request(20_000).encode())
    time.sleep(0.5)  # the POP found nothing and is held (on the event loop)
    s.close()
    time.sleep(0.3)  # the broker has seen the close
    with Producer(broker.namesrv_address, "p") as p:
        p.send(Message("tasks", b"after-close"))
    got, took = _pop_within(broker, 5.0)
    assert [m.body for m in got] == [b"after-close"], "the abandoned long poll took the message"
    assert got[0].reconsume_times == 0  # never popped for the dead client: not even a redelivery
    assert took < 2.0


def test_a_pop_answer_that_cannot_be_written_is_given_back_at_once(broker: RunningBroker) -> None:
    """The other half: the connection closed after the pop, so its answer is never written (`_undelivered`
    in the server calls `give_back_popped`). The same helper here on a real pop's answer."""
    _prepare(broker)
    with Producer(broker.namesrv_address, "p") as p:
        p.send(Message("tasks", b"orphan"))
    broker.store.wait_for_dispatch()
    req = _pop_request(0)
    resp = PopMessageProcessor(broker.broker).process(req, None)
    assert resp.code == ResponseCode.SUCCESS
    assert _pop_within(broker, 0.3)[0] == []  # invisible for INVISIBLE ms
    assert give_back_popped(broker.broker, req, resp) == 1
    got, took = _pop_within(broker, 5.0)
    assert [m.body for m in got] == [b"orphan"] and got[0].reconsume_times == 1
    assert took < 2.0
    assert give_back_popped(broker.broker, req, req.response(ResponseCode.POLLING_TIMEOUT, "none")) == 0
