"""POP long polls held on the broker's event loop (`BrokerServer._pop_hold`), not on worker threads.

A POP that finds nothing and may wait (`pollTime`) used to wait on one of the 64 "broker-blocking" threads; past
64 held POPs the others queued behind them, so a long poll on a busy topic answered only when an idle one timed out.
Now any number are held with no thread, each answered at its own poll time or at the first arrival on its topic,
and RocketMQ's caps (popPollingSize per topic, group and queue, maxPopPollingSize in all) answer POLLING_FULL.

Over a real broker on loopback; the held POPs are raw remoting frames on one socket (requests on one connection
are served concurrently), read back with the broker's own frame decoder."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmq_eventstore.broker import RunningBroker, serve_in_thread
from rmq_eventstore.client import Message, PopConsumer, Producer
from rmq_eventstore.client.pop_consumer import POLLING_FULL_PAUSE
from rmq_eventstore.remoting import FrameDecoder, RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 256 * 1024, "mapped_file_size_consume_queue": 20 * 1000,
         "max_hash_slot_num": 1024, "max_index_num": 4096}
HELD = 100  # more than the 64 broker-blocking threads


def _prepare(rb: RunningBroker, *topics: str) -> None:
    """The topics and group `workers` exist; the group has consumed all there is."""
    with Producer(rb.namesrv_address, "p") as p, PopConsumer(rb.namesrv_address, "workers") as c:
        for t in topics:
            p.send(Message(t, b"warm-up"))
            rb.store.wait_for_dispatch()
            got = c.pop(t, invisible_time=10_000, poll_time=2000)
            assert [m.body for m in got] == [b"warm-up"]
            c.ack(got[0])


def _pop_frame(topic: str, poll_ms: int, queue_id: int = -1) -> bytes:
    return RemotingCommand.request(RequestCode.POP_MESSAGE, {
        "consumerGroup": "workers", "topic": topic, "queueId": queue_id, "maxMsgNums": 32, "invisibleTime": 60_000,
        "pollTime": poll_ms, "bornTime": 0, "initMode": 1, "expType": "TAG", "exp": "*", "order": False}).encode()


class RawConnection:
    """One socket to the broker port: frames written as they are, responses read back with their arrival time."""

    def __init__(self, rb: RunningBroker) -> None:
        host, port = rb.broker_address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.decoder = FrameDecoder()

    def send(self, *frames: bytes) -> None:
        self.sock.sendall(b"".join(frames))

    def read(self, n: int, timeout: float) -> list[tuple[float, RemotingCommand]]:
        got: list[tuple[float, RemotingCommand]] = []
        end = time.monotonic() + timeout
        while len(got) < n and time.monotonic() < end:
            self.sock.settimeout(max(end - time.monotonic(), 0.01))
            try:
                data = self.sock.recv(1 << 16)
            except TimeoutError:
                break
            if not data:
                break
            now = time.monotonic()
            got += [(now, c) for c in self.decoder.feed(data)]
        return got

    def close(self) -> None:
        self.sock.close()


def _blocking_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("broker-blocking"))


@pytest.fixture(params=["ASYNC_FLUSH", "SYNC_FLUSH"])
def broker(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[RunningBroker]:
    """ASYNC_FLUSH: a POP is looked at on the loop; SYNC_FLUSH: on a worker thread (it writes with the flush
    wait), and held on the loop between looks all the same."""
    with serve_in_thread(tmp_path / "store", flush_disk_type=request.param, **SMALL) as rb:
        yield rb


def test_held_pops_take_no_thread_and_answer_at_their_own_time(broker: RunningBroker) -> None:
    _prepare(broker, "idle", "busy")
    threads_before = _blocking_threads()
    raw = RawConnection(broker)
    try:
        t0 = time.monotonic()
        raw.send(*[_pop_frame("idle", 3000) for _ in range(HELD)])
        deadline = time.monotonic() + 5
        while broker.server.pop_held < HELD and time.monotonic() < deadline:
            time.sleep(0.02)
        assert broker.server.pop_held == HELD
        assert broker.broker.pop_service._arrival_waiting == HELD
        # no thread waits for them (SYNC_FLUSH looks at each on a thread, briefly: the pool keeps a few)
        assert _blocking_threads() - threads_before < 16

        # a long poll on another topic, behind them, is woken by its arrival at once
        got: list = []
        with PopConsumer(broker.namesrv_address, "workers") as c:
            popper = threading.Thread(target=lambda: got.extend(c.pop("busy", invisible_time=60_000, poll_time=10_000)))
            popper.start()
            time.sleep(0.3)
            sent = time.monotonic()
            with Producer(broker.namesrv_address, "p") as p:
                p.send(Message("busy", b"now"))
            popper.join(10)
            woken = time.monotonic() - sent
            assert [m.body for m in got] == [b"now"]
            assert woken < 1.0, f"the long poll on 'busy' answered {woken:.2f} s after its arrival"
            c.ack(got[0])

        # each held POP answers POLLING_TIMEOUT at its poll time: all together, none queued behind another
        answers = raw.read(HELD, timeout=8)
        assert len(answers) == HELD
        assert {c.code for _, c in answers} == {ResponseCode.POLLING_TIMEOUT}
        late = [at - t0 for at, _ in answers]
        assert 2.9 <= min(late) and max(late) < 4.5, (min(late), max(late))
    finally:
        raw.close()
    assert broker.server.pop_held == 0 and broker.broker.pop_service._arrival_waiting == 0
    assert broker.broker.pop_service._arrival_waiters == {}


def test_a_held_pop_answers_its_arrival_and_the_others_hold_on(broker: RunningBroker) -> None:
    """One arrival on the topic: one held POP gets it, the others (same topic, the message is taken) go on
    waiting to their poll time; nothing is handed out twice."""
    _prepare(broker, "jobs")
    raw = RawConnection(broker)
    try:
        t0 = time.monotonic()
        raw.send(*[_pop_frame("jobs", 2500) for _ in range(5)])
        deadline = time.monotonic() + 5
        while broker.server.pop_held < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        with Producer(broker.namesrv_address, "p") as p:
            p.send(Message("jobs", b"one"))
        first = raw.read(1, timeout=2)
        assert len(first) == 1 and first[0][1].code == ResponseCode.SUCCESS
        assert first[0][0] - t0 < 2.0
        rest = raw.read(4, timeout=5)
        assert [c.code for _, c in rest] == [ResponseCode.POLLING_TIMEOUT] * 4
        assert min(at for at, _ in rest) - t0 >= 2.4
    finally:
        raw.close()


def test_a_pop_past_the_polling_caps_answers_polling_full(tmp_path: Path) -> None:
    """RocketMQ's popPollingSize (per topic, group and queue id) and maxPopPollingSize (in all): a POP that
    would be held past either answers POLLING_FULL at once (after one more look); our client then waits out a
    moment instead of spinning."""
    with serve_in_thread(tmp_path / "store", pop_polling_size=2, max_pop_polling_size=3, **SMALL) as rb:
        _prepare(rb, "capped")
        raw = RawConnection(rb)
        try:
            raw.send(_pop_frame("capped", 3000, queue_id=0), _pop_frame("capped", 3000, queue_id=0))
            deadline = time.monotonic() + 5
            while rb.server.pop_held < 2 and time.monotonic() < deadline:
                time.sleep(0.02)
            t0 = time.monotonic()
            raw.send(_pop_frame("capped", 3000, queue_id=0))  # a third on queue 0: full for that queue
            (at, full), = raw.read(1, timeout=2)
            assert full.code == ResponseCode.POLLING_FULL and at - t0 < 0.5
            assert "pop_polling_size 2" in (full.remark or "")
            raw.send(_pop_frame("capped", 3000, queue_id=1))  # another queue: held (3 in all)
            while rb.server.pop_held < 3 and time.monotonic() < deadline:
                time.sleep(0.02)
            assert rb.server.pop_held == 3
            t0 = time.monotonic()
            raw.send(_pop_frame("capped", 3000, queue_id=2))  # a fourth: full in all
            (at, full), = raw.read(1, timeout=2)
            assert full.code == ResponseCode.POLLING_FULL and at - t0 < 0.5
            assert "max_pop_polling_size 3" in (full.remark or "")

            # the client: POLLING_FULL gives nothing after a pause, not an error and not at once
            with PopConsumer(rb.namesrv_address, "workers") as c:
                t0 = time.monotonic()
                assert c.pop("capped", invisible_time=60_000, poll_time=3000, queue_id=0) == []
                assert POLLING_FULL_PAUSE - 0.05 <= time.monotonic() - t0 < POLLING_FULL_PAUSE + 1.0
            answers = raw.read(3, timeout=5)  # the three held ones, at their poll time
            assert [c.code for _, c in answers] == [ResponseCode.POLLING_TIMEOUT] * 3
        finally:
            raw.close()
        assert rb.server.pop_held == 0


def test_the_loop_waker_wakes_from_the_loop_at_once_and_from_a_thread_once() -> None:
    """An arrival dispatched on the loop's own thread completes the held POP's future there (no self-pipe
    write); arrivals from another thread schedule one wake, however many come before the loop runs it."""
    import asyncio

    from rmq_eventstore.broker.server import _LoopWaker

    loop = asyncio.new_event_loop()
    scheduled: list[object] = []
    real = loop.call_soon_threadsafe

    def counting(cb, *args):  # type: ignore[no-untyped-def]
        scheduled.append(cb)
        return real(cb, *args)

    loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
    try:
        async def on_the_loop() -> None:
            waker = _LoopWaker(loop)
            waker.set()
            assert waker.fut.done() and not scheduled
            waker.set()  # already done: nothing more
            waker.rearm()
            assert not waker.fut.done()
            t = threading.Thread(target=lambda: [waker.set() for _ in range(5)])
            t.start()
            t.join()
            assert len(scheduled) == 1 and not waker.fut.done()
            await asyncio.wait_for(waker.fut, 2)
            waker.rearm()
            threading.Thread(target=waker.set).start()
            await asyncio.wait_for(waker.fut, 2)  # a later arrival wakes again
            assert len(scheduled) == 2

        loop.run_until_complete(on_the_loop())
    finally:
        loop.close()
