"""`ClientConnection.invoke_frame` of a lone caller in one C call (`_native.client_lone`, THE LONE CALLER block of
_native.c) against invoke_frame itself, the definition: for the same request and the same peer behaviour both
give the same answer or raise the same error and leave the connection in the same state (no request left
waiting, the read role released, closed after a failure or a timeout). Where the C call declines (None: the
connection's lock busy, another caller reading, the connection closed) nothing was sent and nothing changed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from functools import partial

import pytest

from rmq_eventstore.client import remoting_client as rc_mod
from rmq_eventstore.client.remoting_client import RemotingClient, RemotingError, RemotingTimeoutError
from rmq_eventstore.remoting import FLAG_RESPONSE, FrameDecoder, RemotingCommand, RequestCode, SerializeType
from tests.conftest import import_native
from tests.lone_peer import CLOSE, Peer, reply

native = import_native()  # also under RMQ_EVENTSTORE_PURE=1 (make test's second pass): set up here by hand
native.remoting_init(RemotingCommand, SerializeType.JSON)
native.client_lone_init(rc_mod.__dict__)
TAKE = native.client_take_response
CODE = RequestCode.GET_MAX_OFFSET


def request(opaque: int, topic: str = "T") -> bytes:
    return RemotingCommand(CODE, {"topic": topic, "queueId": "0"}, b"", opaque).encode_py()


def call(way: str, conn: rc_mod.ClientConnection, opaque: int, timeout: float = 5.0, take: object = TAKE,
         targs: tuple = (), frame: bytes | None = None) -> object:
    """The request through client_lone ("lone", which must not decline here) or invoke_frame ("frame")."""
    frame = request(opaque) if frame is None else frame
    if way == "lone":
        r = native.client_lone(conn, frame, opaque, CODE, timeout, take, *targs)
        assert r is not None, "declined"
        return r
    return conn.invoke_frame(frame, opaque, CODE, timeout, partial(take, *targs) if targs else take)  # type: ignore[arg-type]


def fields(r: object) -> object:
    if isinstance(r, RemotingCommand):
        return (r.code, r.opaque, r.flag, r.remark, r.ext_fields, r.body, r.language, r.version)
    return r


def idle(conn: rc_mod.ClientConnection) -> bool:
    """No request waiting and nobody holding the read role: what a finished lone request leaves."""
    return not conn._pending and not conn._reader_busy and not conn._idle_reading


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer()
    yield p
    p.close()


WAYS = pytest.mark.parametrize("way", ["lone", "frame"])


@WAYS
def test_answers_as_invoke_frame(way: str, peer: Peer) -> None:
    seen: list[tuple] = []

    def take_none(b: bytearray, n: int, o: int) -> None:  # declines: the response is decoded as usual
        seen.append((bytes(b[:n]), o))

    with RemotingClient() as rc:
        conn = rc.connection(peer.address)
        for i in range(1, 6):  # a few, so SO_RCVTIMEO is set once and kept
            before = time.monotonic()
            r = call(way, conn, i)
            assert fields(r) == fields(FrameDecoder().feed(reply(request(i)))[0])
            assert idle(conn) and conn._last_read >= before
        r = call(way, conn, 9, take=lambda a, b, buf, n, o: (a, b, bytes(buf[:n]), n, o), targs=("x", 2))
        assert r == ("x", 2, reply(request(9)), len(reply(request(9))), 9)  # take(*args, buf, n, opaque)
        r = call(way, conn, 10, take=take_none)
        assert fields(r) == fields(FrameDecoder().feed(reply(request(10)))[0]) and seen == [(reply(request(10)), 10)]
        assert idle(conn) and not conn.closed
        assert peer.frames == [request(i) for i in (1, 2, 3, 4, 5, 9, 10)]  # the frames as given, once each


@WAYS
def test_a_response_in_two_reads(way: str) -> None:
    p = Peer(lambda f: [reply(f)[:20], reply(f)[20:]])  # the take sees half a frame and declines
    try:
        with RemotingClient() as rc:
            conn = rc.connection(p.address)
            assert fields(call(way, conn, 3)) == fields(FrameDecoder().feed(reply(request(3)))[0])
            assert idle(conn)
    finally:
        p.close()


@WAYS
def test_an_error_response_is_the_response(way: str) -> None:
    p = Peer(lambda f: reply(f, code=17, ext={}))
    try:
        with RemotingClient() as rc:
            r = call(way, rc.connection(p.address), 4)
            assert isinstance(r, RemotingCommand) and r.code == 17 and r.opaque == 4
    finally:
        p.close()


def test_declines_with_nothing_done(peer: Peer) -> None:
    with RemotingClient() as rc:
        conn = rc.connection(peer.address)
        conn._reader_busy = True  # another caller reads
        assert native.client_lone(conn, request(1), 1, CODE, 5.0, TAKE) is None
        conn._reader_busy = False
        conn._lock.acquire()  # the lock busy
        try:
            assert native.client_lone(conn, request(2), 2, CODE, 5.0, TAKE) is None
        finally:
            conn._lock.release()
        assert native.client_lone(conn, request(3), 3.0, CODE, 5.0, TAKE) is None  # not an int opaque
        assert idle(conn) and peer.frames == []
        conn.close()
        assert native.client_lone(conn, request(4), 4, CODE, 5.0, TAKE) is None  # closed: invoke_frame raises
        assert peer.frames == []
        with pytest.raises(RemotingError, match="closed"):
            conn.invoke_frame(request(4), 4, CODE, 5.0, TAKE)
    with pytest.raises(TypeError):
        native.client_lone(conn, request(1), 1, CODE, 5.0)


@WAYS
def test_a_timeout_raises_on_time_and_closes_the_connection(way: str, silent_peer: str) -> None:
    with RemotingClient() as rc:
        for timeout in (0.5, 0.2):
            conn = rc.connection(silent_peer)
            t0 = time.monotonic()
            with pytest.raises(RemotingTimeoutError, match=f"to request {int(CODE)} in"):
                call(way, conn, 5, timeout)
            assert timeout - 0.01 <= time.monotonic() - t0 < timeout + 1.0
            assert conn.closed and not conn._pending


@WAYS
def test_close_wakes_a_caller_blocked_in_its_first_read(way: str, silent_peer: str) -> None:
    rc = RemotingClient()
    conn = rc.connection(silent_peer)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call(way, conn, 7, 30.0)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    rc.close()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - t0 < 5
    assert len(errors) == 1 and isinstance(errors[0], RemotingError) and "closed" in str(errors[0]), errors


@WAYS
def test_the_peer_closing_fails_the_connection(way: str) -> None:
    p = Peer(lambda f: CLOSE)
    try:
        with RemotingClient() as rc:
            conn = rc.connection(p.address)
            with pytest.raises(RemotingError, match="closed"):
                call(way, conn, 6)
            assert conn.closed and not conn._pending and not conn._reader_busy
    finally:
        p.close()


@WAYS
def test_a_failed_write_fails_the_connection(way: str, peer: Peer) -> None:
    import socket

    with RemotingClient() as rc:
        conn = rc.connection(peer.address)
        conn.sock.shutdown(socket.SHUT_WR)  # the next send fails (EPIPE)
        with pytest.raises(RemotingError, match="send to .* failed") as ei:
            call(way, conn, 8)
        assert isinstance(ei.value.__cause__, OSError) and ei.value.__context__ is ei.value.__cause__
        assert conn.closed and not conn._pending and not conn._reader_busy


def test_threads_share_a_connection_with_invoke(peer: Peer) -> None:
    """Lone calls (falling back to invoke_frame when they decline, as PopConsumer does) and plain invokes on one
    connection from several threads: every caller gets its own response."""
    errors: list[BaseException] = []
    declined = [0]
    with RemotingClient() as rc:
        conn = rc.connection(peer.address)
        opaques = iter(range(100, 10**6))
        lock = threading.Lock()

        def lone() -> None:
            try:
                for _ in range(200):
                    with lock:
                        o = next(opaques)
                    r = native.client_lone(conn, request(o), o, CODE, 10.0, TAKE)
                    if r is None:
                        declined[0] += 1
                        r = conn.invoke_frame(request(o), o, CODE, 10.0, TAKE)
                    assert r.opaque == o and r.ext_fields == {"echo": str(o)}
            except BaseException as e:
                errors.append(e)

        def plain() -> None:
            try:
                for _ in range(200):
                    cmd = RemotingCommand.request(CODE, {"topic": "T", "queueId": 0})
                    r = conn.invoke(cmd, 10.0)
                    assert r.opaque == cmd.opaque and r.ext_fields == {"echo": str(cmd.opaque)}
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=f) for f in (lone, lone, lone, plain, plain)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors, errors
        assert not conn._pending and len(peer.frames) == 1000


def test_responses_are_flagged_responses(peer: Peer) -> None:
    """A take sees the read as it is: a request-flagged frame with our opaque is no answer to client_take_response."""
    p = Peer(lambda f: RemotingCommand(0, {}, b"", FrameDecoder().feed(f)[0].opaque, 0).encode_py()
             + reply(f))  # a request to us, then the response, in one read
    try:
        with RemotingClient() as rc:
            conn = rc.connection(p.address)
            r = native.client_lone(conn, request(12), 12, CODE, 5.0, TAKE)
            assert isinstance(r, RemotingCommand) and r.flag & FLAG_RESPONSE and r.opaque == 12 and idle(conn)
    finally:
        p.close()
