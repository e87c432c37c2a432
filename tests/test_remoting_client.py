"""The client connection's leader/follower read path against a real broker on loopback: callers read
their own responses, many threads share one connection, a held long poll delays nothing, requests from
the broker arrive while the connection is idle, and failures reach every waiter."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client.remoting_client import RemotingClient, RemotingError, RemotingTimeoutError
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[RunningBroker]:
    rb = serve_in_thread(tmp_path / "store", **SMALL)
    try:
        yield rb
    finally:
        rb.close()


@pytest.fixture
def client() -> Iterator[RemotingClient]:
    c = RemotingClient()
    try:
        yield c
    finally:
        c.close()


def _commit(rc: RemotingClient, addr: str, queue_id: int, offset: int) -> None:
    r = rc.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_CONSUMER_OFFSET, {
        "consumerGroup": "cg", "topic": "t", "queueId": queue_id, "commitOffset": offset}))
    assert r.code == ResponseCode.SUCCESS, r.remark


def _query(rc: RemotingClient, addr: str, queue_id: int) -> int:
    r = rc.invoke(addr, RemotingCommand.request(RequestCode.QUERY_CONSUMER_OFFSET, {
        "consumerGroup": "cg", "topic": "t", "queueId": queue_id}))
    assert r.code == ResponseCode.SUCCESS, r.remark
    return int(r.ext_fields["offset"])


def _send(rc: RemotingClient, addr: str, queue_id: int, body: bytes) -> RemotingCommand:
    return rc.invoke(addr, RemotingCommand.request(RequestCode.SEND_MESSAGE, {
        "producerGroup": "pg", "topic": "t", "defaultTopic": "TBW102", "defaultTopicQueueNums": 4,
        "queueId": queue_id, "sysFlag": 0, "bornTimestamp": int(time.time() * 1000), "flag": 0,
        "properties": "", "reconsumeTimes": 0, "unitMode": False, "batch": False}, body))


def _pull(rc: RemotingClient, addr: str, queue_id: int, offset: int, suspend_ms: int,
          timeout: float) -> RemotingCommand:
    return rc.invoke(addr, RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": "t", "queueId": queue_id, "queueOffset": offset, "maxMsgNums": 32,
        "sysFlag": 2 | 4, "commitOffset": 0, "suspendTimeoutMillis": suspend_ms, "subscription": "*",
        "subVersion": 0, "expressionType": "TAG"}), timeout)


def test_many_threads_get_their_own_responses(broker: RunningBroker, client: RemotingClient) -> None:
    addr = broker.broker_address
    assert _send(client, addr, 0, b"create the topic").code == ResponseCode.SUCCESS
    for q in range(4):
        _commit(client, addr, q, 0)
    errors: list[BaseException] = []

    def worker(q: int) -> None:
        try:
            for i in range(40):  # each thread commits and reads back its own queue's offset
                _commit(client, addr, q, i * 10 + q)
                assert _query(client, addr, q) == i * 10 + q
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(q,)) for q in range(4)]  # one queue per thread
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors
    assert len(client._conns) == 1  # all on one connection


def test_a_held_long_poll_delays_no_other_request(broker: RunningBroker, client: RemotingClient) -> None:
    addr = broker.broker_address
    assert _send(client, addr, 1, b"create the topic").code == ResponseCode.SUCCESS
    result: dict[str, RemotingCommand] = {}
    held = threading.Thread(target=lambda: result.setdefault("r", _pull(client, addr, 0, 0, 10_000, 15)))
    held.start()
    time.sleep(0.2)  # the pull is held by the broker, its thread reads the socket
    t0 = time.monotonic()
    for i in range(20):
        _commit(client, addr, 2, i)
        assert _query(client, addr, 2) == i
    assert time.monotonic() - t0 < 2.0
    assert not result
    t0 = time.monotonic()
    assert _send(client, addr, 0, b"wake").code == ResponseCode.SUCCESS  # same connection
    assert time.monotonic() - t0 < 1.0
    held.join(10)
    assert result["r"].code == ResponseCode.SUCCESS and b"wake" in result["r"].body


def test_a_long_poll_started_second_still_completes(broker: RunningBroker, client: RemotingClient) -> None:
    # the short request holds the read role first and must hand it to the waiting long poll
    addr = broker.broker_address
    assert _send(client, addr, 1, b"create the topic").code == ResponseCode.SUCCESS
    result: dict[str, RemotingCommand] = {}
    stop = threading.Event()

    def chatter() -> None:
        while not stop.is_set():
            _query(client, addr, 1)

    chat = threading.Thread(target=chatter)
    chat.start()
    held = threading.Thread(target=lambda: result.setdefault("r", _pull(client, addr, 3, 0, 10_000, 15)))
    held.start()
    time.sleep(0.3)
    stop.set()
    chat.join(10)
    time.sleep(0.2)  # only the long poll waits now
    with RemotingClient() as other:
        assert _send(other, addr, 3, b"late").code == ResponseCode.SUCCESS
    held.join(10)
    assert result["r"].code == ResponseCode.SUCCESS and b"late" in result["r"].body


def test_timeout_then_the_connection_still_works(broker: RunningBroker, client: RemotingClient) -> None:
    addr = broker.broker_address
    assert _send(client, addr, 1, b"create the topic").code == ResponseCode.SUCCESS
    with pytest.raises(RemotingTimeoutError):
        _pull(client, addr, 0, 0, 5_000, 0.3)
    _commit(client, addr, 1, 7)
    assert _query(client, addr, 1) == 7


def _heartbeat(rc: RemotingClient, addr: str, client_id: str) -> None:
    body = json.dumps({"clientID": client_id, "producerDataSet": [], "consumerDataSet": [{
        "groupName": "cg", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [], "unitMode": False}]})
    r = rc.invoke(addr, RemotingCommand.request(RequestCode.HEART_BEAT, body=body.encode()))
    assert r.code == ResponseCode.SUCCESS


def test_broker_requests_arrive_while_the_connection_is_idle(broker: RunningBroker) -> None:
    addr = broker.broker_address
    got: list[tuple[str, RemotingCommand]] = []
    arrived = threading.Event()

    def on_request(a: str, cmd: RemotingCommand) -> None:
        got.append((a, cmd))
        if len(got) >= 2:
            arrived.set()

    with RemotingClient(on_request=on_request) as first, RemotingClient() as second:
        _heartbeat(first, addr, "c1")  # NOTIFY for c1 itself (maybe read with this response)
        time.sleep(0.3)  # idle: nobody invokes on `first` from now on
        _heartbeat(second, addr, "c2")  # the broker tells c1 the group changed
        assert arrived.wait(3), got
    assert all(a == addr and cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED for a, cmd in got)


def test_a_lost_connection_fails_waiters_and_is_noticed_idle(tmp_path: Path) -> None:
    rb = serve_in_thread(tmp_path / "store", **SMALL)
    addr = rb.broker_address
    with RemotingClient() as rc:
        assert _send(rc, addr, 1, b"create the topic").code == ResponseCode.SUCCESS
        conn = rc.connection(addr)
        with RemotingClient() as idle:
            idle_conn = idle.connection(addr)
            _commit(idle, addr, 0, 1)
            errors: list[BaseException] = []

            def held() -> None:
                try:
                    _pull(rc, addr, 0, 0, 20_000, 25)
                except BaseException as e:
                    errors.append(e)

            t = threading.Thread(target=held)
            t.start()
            time.sleep(0.3)
            t0 = time.monotonic()
            rb.close()
            t.join(10)
            assert time.monotonic() - t0 < 8
            assert len(errors) == 1 and isinstance(errors[0], RemotingError)
            assert not isinstance(errors[0], RemotingTimeoutError)
            assert conn.closed
            deadline = time.monotonic() + 3
            while not idle_conn.closed and time.monotonic() < deadline:
                time.sleep(0.02)
            assert idle_conn.closed  # noticed without any request
            with pytest.raises(RemotingError):
                idle_conn.invoke(RemotingCommand.request(RequestCode.HEART_BEAT, body=b"{}"), 1.0)


def _wait_in_thread(rc: RemotingClient, addr: str, timeout: float) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            rc.invoke(addr, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "t", "queueId": 0}), timeout)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)  # the lone caller is in its blocking recv by now
    return t, errors


def test_a_lone_caller_times_out_on_time(silent_peer: str, client: RemotingClient) -> None:
    """The caller reading its own response blocks in recv, bounded by the socket's receive timeout."""
    for timeout in (0.5, 0.2):  # a shorter timeout than the one the socket has: set again
        t0 = time.monotonic()
        with pytest.raises(RemotingTimeoutError):
            client.invoke(silent_peer, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "t"}), timeout)
        assert timeout - 0.01 <= time.monotonic() - t0 < timeout + 1.0


def test_a_failure_elsewhere_wakes_the_caller_blocked_in_recv(silent_peer: str, client: RemotingClient) -> None:
    """Another caller's timeout fails the connection: the one blocked in its recv hears of it at once."""
    t, errors = _wait_in_thread(client, silent_peer, 30)
    t0 = time.monotonic()
    with pytest.raises(RemotingTimeoutError):
        client.invoke(silent_peer, RemotingCommand.request(RequestCode.GET_MAX_OFFSET, {"topic": "t"}), 0.3)
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], RemotingError), errors


def test_close_wakes_the_caller_blocked_in_recv(silent_peer: str) -> None:
    rc = RemotingClient()
    t, errors = _wait_in_thread(rc, silent_peer, 30)
    t0 = time.monotonic()
    rc.close()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], RemotingError), errors
