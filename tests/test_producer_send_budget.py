"""A send that times out is not sent again: the send's timeout is the whole call's, as in RocketMQ's
`DefaultMQProducerImpl.sendDefaultImpl` (a retry gets what is left of it). A request that got no answer in time
may have been stored, so sending it again could store the message twice: a Celery task run twice, a half
message committed twice. Checked against a real broker process paused (SIGSTOP) past the timeout and resumed
while a retry would still be waiting for its route, so that a retry, had it been made, would be stored too.
Connection failures, where nothing reached the broker, are still retried."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from rmq_eventstore.client import Message, Producer, TransactionProducer, TransactionState
from rmq_eventstore.client.remoting_client import RemotingTimeoutError
from tests.celery_procs import BrokerProcess

TIMEOUT_MS = 600
PAUSE_S = 0.9  # past the send's timeout, within the route refresh's that a retry would make first


@pytest.fixture
def broker(tmp_path: Path):  # type: ignore[no-untyped-def]
    b = BrokerProcess(tmp_path / "store")
    b.start()
    yield b
    if b.proc is not None and b.proc.poll() is None:
        os.kill(b.proc.pid, signal.SIGCONT)
    b.stop()


def paused(pid: int, seconds: float) -> threading.Thread:
    """Stop the process now and resume it `seconds` later (on a thread)."""
    os.kill(pid, signal.SIGSTOP)
    t = threading.Timer(seconds, os.kill, (pid, signal.SIGCONT))
    t.start()
    return t


def copies(b: BrokerProcess, marker: bytes) -> int:
    """How many records of the broker's commitlog hold `marker` (each test's bodies are unique), read after the
    broker stopped (everything it stored is in its files)."""
    b.stop()
    return sum(f.read_bytes().count(marker) for f in sorted((b.store / "commitlog").iterdir()))


@pytest.mark.parametrize("how", ["send", "send_batch"])
def test_a_send_that_timed_out_is_raised_not_sent_again(broker: BrokerProcess, how: str) -> None:
    """`send` (its plain case, the request built in C when the native core is there) and `send_batch` (the
    general path, `_send`)."""
    with Producer(broker.namesrv, "budget", send_timeout_ms=TIMEOUT_MS) as p:
        p.send(Message("budget", b"warm"))  # the topic made and its route cached
        msg = Message("budget", b"once")
        resume = paused(broker.proc.pid, PAUSE_S)
        t0 = time.monotonic()
        try:
            with pytest.raises(RemotingTimeoutError):
                p.send(msg) if how == "send" else p.send_batch([msg])
            took = time.monotonic() - t0
        finally:
            resume.join()
        assert took < TIMEOUT_MS / 1000.0 + 0.25, f"{took:.2f} s: the timeout was not the whole call's"
        p.send(Message("budget", b"after"))  # the broker serves again, after whatever was sent before
    assert copies(broker, b"once") == 1  # stored once: a retry would have been stored too


def test_a_half_message_that_timed_out_is_raised_not_sent_again(broker: BrokerProcess) -> None:
    def checker(msg: object) -> TransactionState:
        return TransactionState.UNKNOWN

    with TransactionProducer(broker.namesrv, "budget-tx", checker, send_timeout_ms=TIMEOUT_MS) as p:
        p.send(Message("budget-tx", b"warm"))
        resume = paused(broker.proc.pid, PAUSE_S)
        try:
            with pytest.raises(RemotingTimeoutError):
                p.prepare(Message("budget-tx", b"half-once"))
        finally:
            resume.join()
        p.send(Message("budget-tx", b"after"))
    assert copies(broker, b"half-once") == 1  # one half: two would each be committed by a check-back


def test_a_refused_connection_is_still_retried(tmp_path: Path) -> None:
    """Nothing reached the broker: the retry on another queue is safe and still made (connection refused)."""
    b = BrokerProcess(tmp_path / "store")
    b.start()
    try:
        with Producer(b.namesrv, "budget", send_timeout_ms=TIMEOUT_MS) as p:
            p.send(Message("budget", b"warm"))
            route = p._base.route("budget")
            # the cached route's first queue pointed at a port nobody listens on, and picked first: the
            # connection is refused, and the retry (the route fetched again) stores it
            route.queues[0] = ("127.0.0.1:1", route.queues[0][1])
            p._rr = itertools.count(0)
            r = p.send(Message("budget", b"retried"))
            assert r.status == "SEND_OK" and r.broker_address != "127.0.0.1:1"
    finally:
        b.stop()
    assert copies(b, b"retried") == 1
