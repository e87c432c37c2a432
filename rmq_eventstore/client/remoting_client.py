"""A synchronous, thread-safe remoting client: one TCP connection per address, requests matched to
responses by `opaque` (`NettyRemotingClient`, without Netty); the waiting callers read the socket
themselves (leader/follower), so a request costs no thread hand-off.

Any number of threads (Django views, Celery workers) may `invoke` on the same connection at once; each
waits only for its own response, so a long-polling pull never delays a send.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from ..remoting import FLAG_RESPONSE, FrameDecoder, FrameError, RemotingCommand, ResponseCode
from ..remoting.command import NATIVE_MODULE

log = logging.getLogger(__name__)

_monotonic = time.monotonic
# the frame codec's C entry points, called here directly (None: the Python codec; RMQ_EVENTSTORE_PURE=1)
_encode = NATIVE_MODULE.remoting_encode if NATIVE_MODULE is not None else None
_take_response = getattr(NATIVE_MODULE, "client_take_response", None)  # a lone caller's read: its response
CLIENT_MAX_FRAME_SIZE = 512 * 1024 * 1024  # a query by key may return 32 records of up to 4 MiB + headroom


class RemotingError(Exception):
    """The request could not be exchanged: connection refused or lost, or no response in time."""


class RemotingTimeoutError(RemotingError):
    """No response within the timeout."""


class MQBrokerError(Exception):
    """The broker (or name server) answered with an error code; `code` and `remark` are RocketMQ's."""

    def __init__(self, code: int, remark: str | None, address: str = "") -> None:
        try:
            name = ResponseCode(code).name
        except ValueError:
            name = str(code)
        super().__init__(f"{name} ({code}) from {address or 'peer'}: {remark or ''}".rstrip(": "))
        self.code = code
        self.remark = remark
        self.address = address


class _Pending:
    """One request waiting for its response. `event` is set when the response (or an error) is in, or
    when the waiter is asked to take over reading the socket (`done` tells which). It is made only when the
    waiter must block while another thread reads (a lone caller reads its own response and never needs
    one); it is made, cleared, set and `done` changed only under the connection's lock, so a waiter that
    finds `done` False there and then blocks on its event is always woken."""

    # class-level defaults, no __init__: making one per request costs an allocation, not a Python frame
    event: threading.Event | None = None
    response: RemotingCommand | None = None
    error: Exception | None = None
    done = False
    ready = True  # its caller waits (may be handed the read role); False while it runs while_waiting


READ_BUFFER_SIZE = 1 << 18  # bytes read at most per recv
RCVTIMEO_SLACK = 0.05  # a caller's blocking recv may outlast its deadline by this much (see _recv_some)
# ... and may stop short of it, when the deadline is up to this many times SO_RCVTIMEO away: _await reads again
# (a consumer alternating POPs with a long-poll timeout and ACKs with the plain one sets it once, not twice a pair)
RCVTIMEO_STRETCH = 2.0
_TIMEVAL = struct.Struct("@ll")  # struct timeval (tv_sec, tv_usec) for SO_RCVTIMEO
IDLE_READ_SECONDS = 0.05  # the idle reader takes over the socket after this long without a waiting caller


class ClientConnection:
    """One connection: `invoke` (blocking, thread-safe), `invoke_oneway`.

    Responses are read by the callers themselves (leader/follower): a caller waiting for a response takes
    the read role if nobody holds it, reads frames and hands other callers' responses to them, and passes
    the role on when its own response is in. A lone caller thus reads its response on its own thread
    (no wake-up of another thread per request), while any number of threads may wait at once, each for
    its own opaque: a long-polling pull never delays a send. When no caller has waited for a while, an
    idle reader thread holds the role, so requests from the broker (NOTIFY_CONSUMER_IDS_CHANGED) and a
    closed connection are noticed promptly; it yields the role to the next caller at once. A caller holding
    the role blocks in `recv` itself (`_recv_some`: no `poll` first), so a failure shuts the socket down to
    wake it.
    """

    def __init__(self, address: str, connect_timeout: float = 3.0,
                 on_request: Callable[[RemotingCommand], None] | None = None) -> None:
        self.address = address
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        try:
            self.sock = socket.create_connection((host, int(port)), timeout=connect_timeout)
        except (OSError, ValueError) as e:
            raise RemotingError(f"cannot connect to {address}: {e}") from e
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
        self._pending: dict[int, _Pending] = {}
        self._lock = threading.Lock()  # guards _pending, _reader_busy, _idle_reading
        self._reader_busy = False  # someone holds the read role
        self._idle_reading = False  # ... and it is the idle reader
        self._last_read = time.monotonic()
        self._decoder = FrameDecoder(CLIENT_MAX_FRAME_SIZE, CLIENT_MAX_FRAME_SIZE)
        self._rbuf = bytearray(READ_BUFFER_SIZE)  # read by the read role's holder only: one at a time
        self._rview = memoryview(self._rbuf)
        self._rcvtimeo = 0.0  # the socket's SO_RCVTIMEO in seconds (0: none, the recv blocks until data)
        self._error: RemotingError | None = None
        self._on_request = on_request
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._poll = select.poll()
        self._poll.register(self.sock, select.POLLIN)
        self._poll.register(self._wake_r, select.POLLIN)
        self._wake_fd = self._wake_r.fileno()
        self.closed = False
        self._shut = False  # close() ran
        self._stop_idle = threading.Event()
        self._idle = threading.Thread(target=self._idle_loop, name=f"remoting-idle-{address}", daemon=True)
        self._idle.start()

    # -- reading ---------------------------------------------------------------------------------------
    def _read_some(self, timeout: float | None) -> bool:
        """Holding the read role: wait up to `timeout` (None: forever) for data, read what is there and
        dispatch every complete frame. False on timeout or a wake-up without data; raises on EOF/error."""
        events = self._poll.poll(None if timeout is None else (int(timeout * 1000) if timeout > 0 else 0))
        if len(events) != 1 or events[0][0] == self._wake_fd:  # not just the socket readable
            readable = False
            for fd, _ev in events:
                if fd == self._wake_fd:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:  # nothing left, or closed by close()
                        pass
                else:
                    readable = True
            if not readable:
                return False
        try:
            # into the connection's buffer, then copied out: `sock.recv(256 KiB)` allocates 256 KiB per call
            # and shrinks it, which is an mmap and a munmap per read (~10 µs) in a process whose malloc has
            # not raised its mmap threshold past that size (it depends on what the process freed before)
            n = self.sock.recv_into(self._rbuf)
        except OSError as e:
            raise RemotingError(f"connection to {self.address} lost: {e}") from e
        return self._dispatch(n)

    def _recv_some(self, timeout: float) -> bool:
        """`_read_some` for a caller holding the read role: a blocking `recv` bounded by the socket's
        SO_RCVTIMEO, without a `poll` first (one system call per response instead of two). Nothing but the
        socket can wake it: `_fail` and `close` shut the socket down, which ends the `recv` (EOF); the idle
        reader, which other callers wake through the wake-up pair, reads through `_read_some` instead.
        SO_RCVTIMEO is set again only when `timeout` is not between RCVTIMEO_SLACK below the value set and
        RCVTIMEO_STRETCH times it (a run of calls with the same timeout, or with two timeouts that close, sets
        it once), so a read may outlast `timeout` by that slack, or end before it (False: the caller reads
        again, with what is left)."""
        if not self._rcvtimeo - RCVTIMEO_SLACK <= timeout <= self._rcvtimeo * RCVTIMEO_STRETCH:
            self._set_rcvtimeo(timeout)
        try:
            n = self.sock.recv_into(self._rbuf)
        except BlockingIOError:  # SO_RCVTIMEO ran out
            return False
        except OSError as e:
            raise RemotingError(f"connection to {self.address} lost: {e}") from e
        return self._dispatch(n)

    def _set_rcvtimeo(self, timeout: float) -> None:
        """SO_RCVTIMEO := `timeout` (at least 1 ms), remembered in `_rcvtimeo`."""
        t = max(timeout, 0.001)
        sec = int(t)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.pack(sec, int((t - sec) * 1e6)))
        self._rcvtimeo = t

    def _dispatch(self, n: int) -> bool:
        """The `n` bytes just read into the buffer: every complete frame dispatched (EOF when 0)."""
        if not n:
            raise RemotingError(f"connection to {self.address} closed")
        data = self._rview[:n].tobytes()
        try:
            frames = self._decoder.feed(data)
        except FrameError as e:
            log.warning("malformed frame from %s: %s", self.address, e)
            raise RemotingError(f"malformed frame from {self.address}: {e}") from e
        for cmd in frames:
            if cmd.flag & FLAG_RESPONSE:
                with self._lock:
                    slot = self._pending.pop(cmd.opaque, None)
                    if slot is not None:
                        slot.response = cmd
                        slot.done = True
                        if slot.event is not None:
                            slot.event.set()
            elif self._on_request is not None:
                # on its own thread: the handler may itself invoke on this connection
                threading.Thread(target=self._handle_request, args=(cmd,), daemon=True,
                                 name=f"remoting-request-{self.address}").start()
        return True

    def _handle_request(self, cmd: RemotingCommand) -> None:
        try:
            assert self._on_request is not None
            self._on_request(cmd)
        except Exception:
            log.exception("handling a request from %s failed", self.address)

    def _fail(self, error: RemotingError) -> None:
        """The connection is unusable: every waiter gets `error`, the socket is closed."""
        with self._lock:
            if self._error is None:
                self._error = error
            self.closed = True
            self._stop_idle.set()
            pending, self._pending = self._pending, {}
            for slot in pending.values():
                slot.error = self._error
                slot.done = True
                if slot.event is not None:
                    slot.event.set()
        self._wake()
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # ends a caller's blocking recv (closing alone does not)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass

    def _release_read_role(self) -> None:
        """Give the read role up and hand it to a caller still waiting (if any)."""
        with self._lock:
            self._reader_busy = False
            self._idle_reading = False
            self._last_read = time.monotonic()
            if self._pending:
                self._hand_on()

    def _hand_on(self) -> None:
        """Under the lock, nobody reading: ask one waiting caller to take the read role. A caller without an
        event does not block yet and takes the role itself when it next looks (`_await`)."""
        for slot in self._pending.values():
            if not slot.done and slot.ready and slot.event is not None:
                slot.event.set()  # "take over reading"
                break

    def _kick(self) -> None:
        """If nobody reads but callers wait (the one handed the role timed out), hand it on."""
        with self._lock:
            if self._reader_busy:
                return
            self._hand_on()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _await(self, slot: _Pending, deadline: float, lead: bool = False,
               first: int | OSError | RemotingError | None = None) -> None:
        """Wait for `slot`'s response, reading the socket whenever nobody else does (`lead`: the caller
        holds the read role already; `first`: holding it, it read that many bytes into the buffer already,
        not dispatched yet, or its read failed with that OSError, or their dispatch with that RemotingError)."""
        while not lead:
            with self._lock:
                slot.ready = True
                if slot.done:
                    return
                lead = not self._reader_busy
                if lead:
                    self._reader_busy = True
                else:
                    event = slot.event
                    if event is None:
                        event = slot.event = threading.Event()
                    else:
                        event.clear()
                    if self._idle_reading:
                        self._wake()  # the idle reader yields the role to us
            if not lead:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not event.wait(remaining):
                    if slot.done:
                        return
                    raise RemotingTimeoutError("timeout")
        try:
            if first is not None:
                if isinstance(first, RemotingError):
                    raise first
                if first.__class__ is not int:
                    raise RemotingError(f"connection to {self.address} lost: {first}") from first
                self._dispatch(first)  # type: ignore[arg-type]
            while not slot.done:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RemotingTimeoutError("timeout")
                self._recv_some(remaining)
        except RemotingTimeoutError:
            raise
        except RemotingError as e:
            self._fail(e)  # every waiter, this one included, gets the error
        finally:
            self._release_read_role()

    def _idle_loop(self) -> None:
        """Hold the read role while no caller waits, so broker requests and EOF are seen."""
        while not self.closed:
            with self._lock:
                idle_for = time.monotonic() - self._last_read
                take = not self._reader_busy and not self._pending and idle_for >= IDLE_READ_SECONDS
                if take:
                    self._reader_busy = True
                    self._idle_reading = True
            if not take:
                self._kick()
                self._stop_idle.wait(max(IDLE_READ_SECONDS - idle_for, 0.0) if idle_for < IDLE_READ_SECONDS
                                     else IDLE_READ_SECONDS)
                continue
            try:
                while not self.closed:
                    with self._lock:
                        if self._pending:  # a caller wants the role
                            break
                    self._read_some(None)
            except RemotingError as e:
                self._fail(e if not self.closed else RemotingError(f"connection to {self.address} is closed"))
            except Exception as e:  # the socket was closed under us, or worse: never keep the role
                self._fail(RemotingError(f"connection to {self.address} failed: {e}"))
            finally:
                self._release_read_role()
        # the connection is dead and its waiters failed: free the wake-up pair now (close() may never
        # be called for a connection the pool replaced)
        for s in (self._wake_r, self._wake_w):
            s.close()

    # -- writing ---------------------------------------------------------------------------------------
    def _send(self, frame: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(frame)
        except OSError as e:
            self._fail(RemotingError(f"send to {self.address} failed: {e}"))
            raise RemotingError(f"send to {self.address} failed: {e}") from e

    def invoke(self, cmd: RemotingCommand, timeout: float,
               while_waiting: Callable[[], None] | None = None) -> RemotingCommand:
        """Send a request and wait for its response (raises `RemotingError` on failure or timeout).

        `while_waiting` (which must not raise) runs on this thread once the request is written, before the
        response is read: other I/O overlaps the round trip (e.g. a database insert). Meanwhile the read
        role is never handed to this caller (it is not waiting), so other callers' answers still flow.

        A caller that finds nobody reading takes the read role as it registers its request (one lock round
        instead of two): the lone caller's path (`invoke_frame`)."""
        return self.invoke_frame(cmd.encode(), cmd.opaque, cmd.code, timeout, _take_response, while_waiting)

    def invoke_frame(self, frame: bytes, opaque: int, code: int, timeout: float,
                     take: Callable[[bytearray, int, int], Any] | None = None,
                     while_waiting: Callable[[], None] | None = None) -> Any:
        """`invoke` of a request encoded already (`frame`, its `opaque` and request `code`), for a caller that
        waits (no `while_waiting`): `invoke` and `RemotingClient.invoke` come here, and the producer's single
        send, which builds its frame in one C call (`Producer.send`).

        A lone caller (it takes the read role as it registers its request) makes its first read here and
        asks `take(buffer, n, opaque)` about it: when that read is exactly its response, in a shape `take`
        covers, take's answer is returned (the producer's: the SendResult values, no RemotingCommand made;
        `invoke`'s: the response, decoded straight from the buffer), the slot dropped and the read role
        released in one lock round, as `_dispatch` and `_release_read_role` would. Without `take` that read
        is dispatched, and when it held the response the role is released at once. Anything else (other
        frames in the read, a partial one, a shape `take` declines, an error, another caller reading) goes
        on exactly as `invoke` always did, and the answer is the response RemotingCommand.

        With `while_waiting` (see `invoke`) the caller registers without the read role (nor is it handed the
        role while `while_waiting` runs); afterwards it takes the role if nobody holds it and its response
        has not been read meanwhile, and goes on as a lone caller."""
        slot = _Pending()
        lock = self._lock
        lock.acquire()  # (acquire/release rather than `with`: no bound __enter__/__exit__ made per request)
        try:
            if self.closed:
                raise self._error or RemotingError(f"connection to {self.address} is closed")
            self._pending[opaque] = slot
            if while_waiting is None:
                lead = not self._reader_busy
                if lead:
                    self._reader_busy = True
            else:
                lead = False
                slot.ready = False  # running while_waiting: not handed the read role meanwhile
        finally:
            lock.release()
        deadline = _monotonic() + timeout
        send_lock = self._send_lock
        try:
            send_lock.acquire()  # _send, inline
            try:
                self.sock.sendall(frame)
            finally:
                send_lock.release()
        except OSError as e:
            self._send_failed(e, opaque, lead)
        if while_waiting is not None:
            while_waiting()
            lock.acquire()
            try:
                slot.ready = True
                lead = not slot.done and not self._reader_busy
                if lead:
                    self._reader_busy = True
            finally:
                lock.release()
        first: int | OSError | RemotingError | None = None
        if lead:
            remaining = deadline - _monotonic()
            if remaining > 0:  # else _await raises the timeout
                if not self._rcvtimeo - RCVTIMEO_SLACK <= remaining <= self._rcvtimeo * RCVTIMEO_STRETCH:
                    self._set_rcvtimeo(remaining)
                try:
                    n = self.sock.recv_into(self._rbuf)
                except BlockingIOError:  # SO_RCVTIMEO ran out: _await looks at the deadline and reads again
                    pass
                except OSError as e:
                    first = e
                else:
                    if not n:
                        first = n  # EOF: _await fails the connection
                    elif take is not None and not self._decoder._buf:
                        got = take(self._rbuf, n, opaque)
                        if got is not None:
                            lock.acquire()
                            try:
                                mine = self._pending.pop(opaque, None)
                                self._reader_busy = False
                                self._idle_reading = False
                                self._last_read = _monotonic()
                                if self._pending:
                                    self._hand_on()
                            finally:
                                lock.release()
                            if mine is None:  # _fail took it meanwhile: its error, as _dispatch would leave it
                                raise self._lost(slot)
                            return got
                        first = n
                    else:
                        return self._first_dispatch(opaque, code, slot, deadline, timeout, n)
        return self._finish(opaque, code, slot, deadline, timeout, lead, first)

    # the tails of invoke_frame, shared with its C twin (_native.client_lone, the lone caller's path in one call)
    def _send_failed(self, e: OSError, opaque: int, lead: bool) -> None:
        """The request's write failed with `e`: the connection fails, the request is dropped (and the read role
        released when the caller held it), RemotingError raised."""
        self._fail(RemotingError(f"send to {self.address} failed: {e}"))
        with self._lock:
            self._pending.pop(opaque, None)
        if lead:
            self._release_read_role()
        raise RemotingError(f"send to {self.address} failed: {e}") from e

    def _lost(self, slot: _Pending) -> Exception:
        """What a caller whose response was read raises when `_fail` took its slot meanwhile."""
        return slot.error or RemotingError(f"connection to {self.address} failed")

    def _first_dispatch(self, opaque: int, code: int, slot: _Pending, deadline: float, timeout: float,
                        n: int) -> RemotingCommand:
        """The read role's holder read `n` bytes its `take` did not look at (none given, or the decoder holds
        a partial frame): dispatched; when its response was in them the role goes at once (_await's finally)."""
        try:
            self._dispatch(n)
        except RemotingError as e:
            return self._finish(opaque, code, slot, deadline, timeout, True, e)
        if slot.done:
            self._release_read_role()
            if slot.error is not None:
                raise slot.error
            return slot.response  # type: ignore[return-value]
        return self._finish(opaque, code, slot, deadline, timeout, True, None)

    def invoke_many(self, cmds: list[RemotingCommand], timeout: float) -> list[RemotingCommand]:
        """Send several requests with one write (pipelined: the broker serves them in order and answers
        those it can at once with one write too) and wait for their responses, in the order of `cmds`."""
        return self.invoke_frames(b"".join(cmd.encode() for cmd in cmds), [(cmd.opaque, cmd.code) for cmd in cmds],
                                  timeout)

    def invoke_frames(self, frames: bytes, requests: list[tuple[int, int]], timeout: float) -> list[RemotingCommand]:
        """`invoke_many` of requests encoded already: `frames` (their frames, one after the other) and each
        one's (opaque, request code), in order; their responses in that order."""
        slots = [_Pending() for _ in requests]
        with self._lock:
            if self.closed:
                raise self._error or RemotingError(f"connection to {self.address} is closed")
            for (opaque, _), slot in zip(requests, slots, strict=True):
                self._pending[opaque] = slot
        deadline = time.monotonic() + timeout
        try:
            self._send(frames)
        except RemotingError:
            with self._lock:
                for opaque, _ in requests:
                    self._pending.pop(opaque, None)
            raise
        return [self._finish(opaque, code, slot, deadline, timeout)
                for (opaque, code), slot in zip(requests, slots, strict=True)]

    def _finish(self, opaque: int, code: int, slot: _Pending, deadline: float, timeout: float,
                lead: bool = False, first: int | OSError | RemotingError | None = None) -> RemotingCommand:
        """The response to the request (`opaque`, `code`) sent already: wait for it up to `deadline`
        (`lead`: holding the read role; `first`: see `_await`)."""
        try:
            self._await(slot, deadline, lead, first)
        except RemotingTimeoutError:
            with self._lock:
                self._pending.pop(opaque, None)
            self._kick()
            if not slot.done:
                # Close the connection, as RocketMQ's client does (clientCloseSocketIfTimeout, true by default):
                # a peer that left a request unanswered for its whole timeout is most likely gone silent (a
                # network stall, a half-open connection after a NAT forgot it), and the next request should
                # connect afresh rather than wait on the same dead socket again. Requests still waiting on it
                # fail at once.
                self._fail(RemotingTimeoutError(f"connection to {self.address} closed: request {code} "
                                                f"unanswered in {timeout:.1f}s"))
                raise RemotingTimeoutError(
                    f"no response from {self.address} to request {code} in {timeout:.1f}s") from None
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        if self.closed:
            raise self._error or RemotingError(f"connection to {self.address} is closed")
        cmd.flag |= 0x2
        self._send(cmd.encode())

    def close(self) -> None:
        with self._lock:
            if self._shut:
                return
            self._shut = True
            self.closed = True
            self._stop_idle.set()
            if self._error is None:
                self._error = RemotingError(f"connection to {self.address} is closed")
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._wake()
        if threading.current_thread() is not self._idle:
            self._idle.join(timeout=5)
        self._fail(self._error)
        for s in (self._wake_r, self._wake_w):
            s.close()


# ClientConnection.invoke_frame's lone caller in one C call (THE LONE CALLER block of _native.c): it reads this
# module's _Pending and RCVTIMEO bounds, and ends in invoke_frame's tails (_send_failed, _first_dispatch, _finish,
# _lost). None without the extension (or under RMQ_EVENTSTORE_PURE=1): invoke_frame, the definition.
_lone_init = getattr(NATIVE_MODULE, "client_lone_init", None)
if _lone_init is not None:
    _lone_init(globals())
client_lone: Callable[..., Any] | None = getattr(NATIVE_MODULE, "client_lone", None) if _lone_init is not None else None


class RemotingClient:
    """Connections by address, created on first use and re-created after a failure (thread-safe)."""

    def __init__(self, connect_timeout: float = 3.0,
                 on_request: Callable[[str, RemotingCommand], None] | None = None,
                 on_reconnect: Callable[[str], None] | None = None,
                 sign: Callable[[RemotingCommand], None] | None = None) -> None:
        self.connect_timeout = connect_timeout
        self._sign = sign  # ACL: adds AccessKey and Signature to every request sent
        self._on_request = on_request
        self._on_reconnect = on_reconnect  # called (on a new thread) when a lost connection is re-made
        self._conns: dict[str, ClientConnection] = {}
        self._lock = threading.Lock()
        self._closed = False

    def connection(self, address: str) -> ClientConnection:
        c = self._conns.get(address)
        if c is not None and not c.closed:
            return c
        reconnected = False
        with self._lock:
            if self._closed:
                raise RemotingError("client is shut down")
            c = self._conns.get(address)
            if c is None or c.closed:
                reconnected = c is not None
                cb = self._on_request
                c = ClientConnection(address, self.connect_timeout,
                                     (lambda cmd, a=address: cb(a, cmd)) if cb is not None else None)
                self._conns[address] = c
        if reconnected and self._on_reconnect is not None:
            threading.Thread(target=self._on_reconnect, args=(address,), daemon=True,
                             name=f"remoting-reconnect-{address}").start()
        return c

    def __enter__(self) -> RemotingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def invoke(self, address: str, cmd: RemotingCommand, timeout: float = 3.0,
               while_waiting: Callable[[], None] | None = None) -> RemotingCommand:
        if self._sign is not None:
            self._sign(cmd)
        c = self._conns.get(address)  # connection(), its common case inline
        if c is None or c.closed:
            c = self.connection(address)
        if while_waiting is None:
            frame = _encode(cmd) if _encode is not None else None  # RemotingCommand.encode, its C part inline
            return c.invoke_frame(frame if frame is not None else cmd.encode(), cmd.opaque, cmd.code, timeout,
                                  _take_response)
        return c.invoke(cmd, timeout, while_waiting)

    def invoke_many(self, address: str, cmds: list[RemotingCommand], timeout: float = 3.0) -> list[RemotingCommand]:
        """`ClientConnection.invoke_many`: several requests in one write, their responses in order."""
        if self._sign is not None:
            for cmd in cmds:
                self._sign(cmd)
        return self.connection(address).invoke_many(cmds, timeout)

    def invoke_oneway(self, address: str, cmd: RemotingCommand) -> None:
        if self._sign is not None:
            self._sign(cmd)
        self.connection(address).invoke_oneway(cmd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
