"""The broker's event loop (uvloop when installed, asyncio's otherwise, or as asked) and its write path:
responses to the requests of one read go out with one write."""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
import time
from pathlib import Path

import pytest

from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.broker import server as server_module
from rmq_eventstore.broker.server import EVENT_LOOP_ENV, new_event_loop
from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer
from rmq_eventstore.remoting import FrameDecoder, RemotingCommand, RequestCode, ResponseCode

SMALL = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
         "max_hash_slot_num": 4096, "max_index_num": 16384}
HAVE_UVLOOP = importlib.util.find_spec("uvloop") is not None


def test_event_loop_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    loop, name = new_event_loop("asyncio")
    try:
        assert name == "asyncio" and type(loop).__module__.startswith("asyncio")
    finally:
        loop.close()
    loop, name = new_event_loop()  # auto
    try:
        assert name.startswith("uvloop ") if HAVE_UVLOOP else name == "asyncio"
    finally:
        loop.close()
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    loop, name = new_event_loop()
    loop.close()
    assert name == "asyncio"
    with pytest.raises(ValueError, match="event_loop must be one of auto, uvloop, asyncio, not 'tokio'"):
        new_event_loop("tokio")
    if not HAVE_UVLOOP:
        with pytest.raises(ValueError, match=r"uvloop is not installed"):
            new_event_loop("uvloop")


@pytest.mark.parametrize("kind", ["asyncio", "uvloop"])
def test_broker_serves_on_either_loop(tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture) -> None:
    if kind == "uvloop" and not HAVE_UVLOOP:
        pytest.skip("uvloop is not installed (the `speed` extra)")
    caplog.set_level(logging.INFO, logger="rmq_eventstore.broker.server")
    with serve_in_thread(tmp_path / "s", announce=False, event_loop=kind, **SMALL) as rb:
        assert rb.event_loop.split()[0] == kind
        assert f"event loop {rb.event_loop}" in caplog.text  # the broker says which loop serves
        loop_type = type(rb.loop)
        assert (loop_type.__module__.startswith("uvloop")) == (kind == "uvloop")
        with Producer(rb.namesrv_address, "pg") as p, PullConsumer(rb.namesrv_address, "cg") as c:
            p.send_batch([Message("loops", f"m{i}".encode()) for i in range(20)], queue_id=0)
            r = p.send(Message("loops", b"single"), queue_id=0)
            assert rb.store.wait_for_dispatch(5)
            res = c.pull("loops", 0, 0, max_nums=32, suspend_timeout_ms=3000)
            assert res.status == FOUND and len(res.messages) == 21
            assert res.messages[-1].msg_id == r.offset_msg_id
            # a long poll parked on this loop is woken by an arrival
            got: list = []
            t = threading.Thread(target=lambda: got.append(c.pull("loops", 1, 0, suspend_timeout_ms=5000)))
            t.start()
            time.sleep(0.2)
            p.send(Message("loops", b"wake"), queue_id=1)
            t.join(10)
            assert got and got[0].status == FOUND and got[0].messages[0].body == b"wake"


def test_responses_of_one_read_are_written_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Twenty sends in one TCP write come back as twenty responses, in order, written with at most one
    write per read of the connection (one per response before)."""
    reads: list[int] = []
    writes: list[int] = []
    real_received = server_module.Connection.data_received
    real_write = server_module.Connection._write_frame

    def data_received(self, data: bytes) -> None:
        if not self.namesrv:
            reads.append(len(data))
        real_received(self, data)

    def write_frame(self, frame: bytes) -> None:
        if not self.namesrv:
            writes.append(len(frame))
        real_write(self, frame)

    monkeypatch.setattr(server_module.Connection, "data_received", data_received)
    monkeypatch.setattr(server_module.Connection, "_write_frame", write_frame)
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL) as rb:
        host, port = rb.broker_address.rsplit(":", 1)
        reqs = [RemotingCommand.request(RequestCode.SEND_MESSAGE_V2, {
            "a": "pg", "b": "piped", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 0, "h": 0, "i": "", "j": 0,
            "k": False}, f"body-{i}".encode()) for i in range(20)]
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"".join(r.encode() for r in reqs))
            dec = FrameDecoder()
            got: list[RemotingCommand] = []
            while len(got) < len(reqs):
                data = s.recv(1 << 16)
                assert data, "the broker closed the connection"
                got += dec.feed(data)
        assert [g.opaque for g in got] == [r.opaque for r in reqs]
        assert all(g.code == ResponseCode.SUCCESS and g.is_response for g in got)
        assert [int(g.ext_fields["queueOffset"]) for g in got] == list(range(20))
        assert len(writes) <= len(reads) < len(reqs), (reads, writes)
        assert sum(writes) == sum(len(g.encode()) for g in got)


def test_pop_with_messages_is_served_on_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A POP that finds messages is answered on the event loop (no worker thread); one that must wait for
    an arrival is held on the loop too (`_pop_hold`, no worker thread) and is woken by the arrival."""
    from rmq_eventstore.client import PopConsumer

    offloaded: list[int] = []
    real = server_module.BrokerServer._offloaded

    async def counting(self, conn, cmd):  # noqa: ANN001, ANN202
        offloaded.append(cmd.code)
        await real(self, conn, cmd)

    monkeypatch.setattr(server_module.BrokerServer, "_offloaded", counting)
    held: list[bool] = []
    real_hold = server_module.BrokerServer._pop_hold

    async def holding(self, conn, cmd, seen, in_thread):  # noqa: ANN001, ANN202
        held.append(in_thread)
        await real_hold(self, conn, cmd, seen, in_thread)

    monkeypatch.setattr(server_module.BrokerServer, "_pop_hold", holding)
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL) as rb:
        ns = rb.namesrv_address
        with Producer(ns, "pg") as p, PopConsumer(ns, "popg") as c:
            p.send_batch([Message("popped", f"m{i}".encode()) for i in range(8)], queue_id=0)
            rb.store.wait_for_dispatch(5)
            got = c.pop("popped", max_nums=8, invisible_time=30_000, poll_time=2000)
            assert sorted(m.body for m in got) == [f"m{i}".encode() for i in range(8)]
            c.ack_batch(got)
            assert RequestCode.POP_MESSAGE not in offloaded
            later: list = []
            t = threading.Thread(target=lambda: later.append(c.pop("popped", max_nums=8, invisible_time=30_000,
                                                                   poll_time=5000)))
            t.start()
            time.sleep(0.3)
            p.send(Message("popped", b"late"), queue_id=0)
            t.join(10)
            assert later and [m.body for m in later[0]] == [b"late"]
            assert RequestCode.POP_MESSAGE not in offloaded and held == [False]  # the waiting one: held on the loop


def test_short_stream_reads_are_served_on_the_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """QUERY_STREAM of a stream the broker knows to be short is answered on the loop; a key read (length
    unknown) goes to a worker thread; both answer the same events."""
    from rmq_eventstore.client import Admin

    offloaded: list[int] = []
    real = server_module.BrokerServer._offloaded

    async def counting(self, conn, cmd):  # noqa: ANN001, ANN202
        offloaded.append(cmd.code)
        await real(self, conn, cmd)

    monkeypatch.setattr(server_module.BrokerServer, "_offloaded", counting)
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL) as rb:
        ns = rb.namesrv_address
        with Producer(ns, "pg") as p, Admin(ns) as admin:
            for i in range(3):
                p.send(Message("streams", f"e{i}".encode(), keys=["acct-1"]), stream="acct-1", expected_version=i)
            assert rb.store.wait_for_dispatch(5)
            assert [m.body for m in admin.read_stream("streams", "acct-1")] == [b"e0", b"e1", b"e2"]
            assert [m.body for m in admin.read_stream("streams", "acct-1", last=1)] == [b"e2"]
            assert RequestCode.QUERY_STREAM not in offloaded
            assert [m.body for m in admin.query_key_all("streams", "acct-1")] == [b"e0", b"e1", b"e2"]
            assert offloaded.count(RequestCode.QUERY_STREAM) == 1


def test_sends_on_the_loop_are_dispatched_on_the_loop(tmp_path: Path) -> None:
    """A lone producer's sends are dispatched by the event loop right after their responses are written:
    the dispatch thread is not woken per send (a futex wake-up and two GIL hand-offs each), and every
    message is in its queue and in the index once its send returned and the loop went round once more."""
    with serve_in_thread(tmp_path / "s", announce=False, **SMALL) as rb:
        svc = rb.store.reput_message_service
        sets: list[str] = []
        event = svc._wakeup
        real_set = event.set

        def counting_set() -> None:
            sets.append(threading.current_thread().name)
            real_set()

        with Producer(rb.namesrv_address, "loop-dispatch") as p:
            p.send(Message("onloop", b"warm-up"), queue_id=0)  # creates the topic
            rb.store.wait_for_dispatch(5)
            event.set = counting_set  # type: ignore[method-assign]
            try:
                results = [p.send(Message("onloop", f"m{i}".encode(), keys=[f"k{i}"]), queue_id=0)
                           for i in range(50)]
            finally:
                del event.set
        assert [r.queue_offset for r in results] == list(range(1, 51))
        assert len(sets) <= 5, sets  # was about one per send
        deadline = time.monotonic() + 5
        while rb.store.get_max_offset_in_queue("onloop", 0) < 51 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rb.store.get_max_offset_in_queue("onloop", 0) == 51
        assert [m.body for m in rb.store.query_message("onloop", "k49").messages] == [b"m49"]
