"""`invoke(..., while_waiting=...)`: the caller's own I/O runs between writing a request and reading its
answer, and the connection's leader/follower reading goes on for the other callers meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.client.remoting_client import RemotingClient
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
         "max_hash_slot_num": 4096, "max_index_num": 16384}


def _extensions() -> RemotingCommand:
    return RemotingCommand.request(RequestCode.GET_BROKER_EXTENSIONS, {})


def _held_pull() -> RemotingCommand:
    """A pull of an empty queue that the broker holds for 3 s (its answer comes late)."""
    return RemotingCommand.request(RequestCode.PULL_MESSAGE, {
        "consumerGroup": "cg", "topic": "t", "queueId": 0, "queueOffset": 1, "maxMsgNums": 32,
        "sysFlag": 2 | 4, "commitOffset": 0, "suspendTimeoutMillis": 3000, "subscription": "*",
        "subVersion": 0, "expressionType": "TAG"})


def test_other_callers_are_answered_while_one_runs_its_own_io(tmp_path: Path) -> None:
    """A caller inside `while_waiting` is not waiting for its answer: the read role must never be handed
    to it. Here its request is a held pull (no answer for 3 s) and it stays in `while_waiting` until
    another caller on the same connection got its answer, which needs somebody to read the socket; the
    idle reader held the role before, and hands it on when the other caller comes."""
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL) as rb, RemotingClient() as client:
        addr = rb.broker_address
        send = RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
            "a": "pg", "b": "t", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0, "i": "", "j": 0,
            "k": False}, b"one")
        assert client.invoke(addr, send, 3.0).code == ResponseCode.SUCCESS
        time.sleep(0.3)  # the connection's idle reader now holds the read role
        other_done = threading.Event()
        other: list = []
        order: list[str] = []

        def own_io() -> None:
            order.append("own io")
            other_thread.start()
            other_done.wait(5)  # e.g. a database insert that takes a while
            order.append("own io done")

        def other_caller() -> None:
            t = time.monotonic()
            other.append((client.invoke(addr, _extensions(), 4.0), time.monotonic() - t))
            other_done.set()

        other_thread = threading.Thread(target=other_caller)
        r = client.invoke(addr, _held_pull(), 8.0, while_waiting=own_io)
        other_thread.join(10)
        assert r.code == ResponseCode.PULL_NOT_FOUND
        assert order == ["own io", "own io done"]
        assert other and other[0][0].code == ResponseCode.SUCCESS
        assert other[0][1] < 2.0, f"the other caller waited {other[0][1]:.1f} s for its answer"
