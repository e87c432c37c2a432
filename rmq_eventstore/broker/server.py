"""The broker's network face: an asyncio server speaking RocketMQ's remoting protocol on two ports, the
broker port (default 10911) and the name-server port (default 9876, routes for this single broker).

Requests on one connection are served concurrently, as Netty's broker does: a pull that found nothing
is parked (`PullHold`) as a task woken by the store's dispatcher, so a send behind it on the same
connection is answered at once. Quick requests run inline on the event loop (an ASYNC_FLUSH put is a
memory copy); with SYNC_FLUSH, sends, acks and POPs (which write records) run in a thread pool so that
the fsync wait never stalls the loop. A POP is first tried on the loop without waiting; one that found
nothing and may wait (`pollTime`) is held on the loop (`_pop_hold`, RocketMQ's PopLongPollingService), woken by
an arrival on its topic or its pop retry topic, with no thread per waiting POP. A QUERY_STREAM (our stream
read) goes to a thread unless the dispatcher is caught up and the stream is known to be short.
A frame that cannot be decoded closes its connection with one warning line; other connections go on.
Responses are written in the order they complete (those answered while one read's requests are
served are written together, with one write); backpressure: when a client does not read its
responses, reading from it pauses.

The loop is uvloop's when it is installed (the `speed` extra) and the asyncio default otherwise;
`event_loop="asyncio"` (or the environment variable `RMQ_EVENTSTORE_EVENT_LOOP=asyncio`) picks the
default loop even then, `"uvloop"` insists on uvloop. The broker logs which loop serves.

`serve_in_thread(path, ...)` opens the store, starts a `Broker` and the server on a background thread
and returns a `RunningBroker` (ports 0 = pick free ones); `close()` shuts everything down cleanly. Once
it serves, it announces itself in `<store>/broker.json` (`common/broker_file.py`) so that other
processes find it (`rmq_eventstore.client.local`); `close()` removes the file if it is still ours.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import ipaddress
import logging
import os
import socket
import threading
import time
from typing import Any

from ..common.broker_file import remove_broker_file_if_ours, write_broker_file
from ..common.topic import TopicValidationError
from ..remoting import (
    DEFAULT_MAX_FRAME_SIZE,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    FrameDecoder,
    FrameError,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from ..store import FlushDiskType, MessageStore, StoreConfig
from .broker import Broker
from .config import BrokerConfig
from .long_polling import PullHold
from .processor.end_transaction import END_FRAME, EndTransactionProcessor
from .processor.pop import ACK_BODY, ACK_FRAME, POP_FRAME, PopMessageProcessor, give_back_popped
from .processor.send import NATIVE_FRAME_LANE, NATIVE_LANE

log = logging.getLogger(__name__)

_SEND_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
                         RequestCode.CONSUMER_SEND_MSG_BACK})
# requests whose records are written with the store's flush wait (on threads under SYNC_FLUSH)
_WRITE_CODES = _SEND_CODES | {RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE,
                              RequestCode.CHANGE_MESSAGE_INVISIBLETIME}
_SEND_V2 = RequestCode.SEND_MESSAGE_V2
_ACK, _BATCH_ACK = RequestCode.ACK_MESSAGE, RequestCode.BATCH_ACK_MESSAGE
_BLOCKING_CODES = frozenset({RequestCode.DELETE_TOPIC_IN_BROKER})
# tried on the loop first (`Broker.process_now`), on a thread when they would wait
_QUICK_FIRST_CODES = frozenset({RequestCode.POP_MESSAGE, RequestCode.QUERY_STREAM, RequestCode.END_TRANSACTION})
_END = RequestCode.END_TRANSACTION
_POP = RequestCode.POP_MESSAGE
_POLLING_TIMEOUT, _POLLING_FULL = int(ResponseCode.POLLING_TIMEOUT), int(ResponseCode.POLLING_FULL)
POP_RELOOK_SECONDS = 0.5  # a held POP looks again this often even unwoken (as `PopService.pop` waits)
MAX_WRITE_BUFFER = 256 * 1024 * 1024  # a client that reads nothing while its responses pile up is dropped
EVENT_LOOP_ENV = "RMQ_EVENTSTORE_EVENT_LOOP"
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def new_event_loop(kind: str | None = None) -> tuple[asyncio.AbstractEventLoop, str]:
    """A new event loop for the server and the name of its implementation.

    `kind`: "auto" (uvloop when it is installed, else asyncio's default loop), "uvloop" (an error
    without it) or "asyncio"; None reads `RMQ_EVENTSTORE_EVENT_LOOP` (default "auto")."""
    if kind is None:
        kind = os.environ.get(EVENT_LOOP_ENV, "").strip().lower() or "auto"
    if kind not in EVENT_LOOPS:
        raise ValueError(f"event_loop must be one of {', '.join(EVENT_LOOPS)}, not {kind!r}")
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise ValueError("event_loop='uvloop' but uvloop is not installed "
                                 "(pip install 'rmq-eventstore[speed]')") from None
        else:
            return uvloop.new_event_loop(), f"uvloop {uvloop.__version__}"
    return asyncio.new_event_loop(), "asyncio"


def _format_peer(peer: Any) -> str:
    if isinstance(peer, tuple) and len(peer) >= 2:
        host, port = peer[0], peer[1]
        if host.startswith("::ffff:") and "." in host:
            host = host[7:]
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return "127.0.0.1:0"


class Connection(asyncio.Protocol):
    """One client connection (the broker's `Channel`): decodes frames, dispatches, writes responses."""

    def __init__(self, server: BrokerServer, namesrv: bool) -> None:
        self.server = server
        self.namesrv = namesrv
        self.decoder = FrameDecoder(server.max_frame_size)
        self.transport: asyncio.Transport | None = None
        self.remote_address = "127.0.0.1:0"
        self.closed = False
        self.tasks: set[asyncio.Task] = set()
        self.last_active = 0.0
        self._out: list[bytes] | None = None  # while a read's requests are served: their response frames
        # a read that is one plain SEND_MESSAGE_V2 frame is served from its bytes (`_native.send_frame`); its
        # fixed arguments, with the decoder's buffer (a bytearray it keeps for good: empty between frames)
        self._frame_lane = None if namesrv else server._frame_lane
        self._frame_args = (server._lane_ctx, server._hold_for_send, self.decoder.max_frame_size,
                            self.decoder.max_header_size, self.decoder._buf)
        # a read that is one POP_MESSAGE frame: its fields read from its bytes (`_native.pop_frame`), served by
        # `PopMessageProcessor.serve_frame` when it is the common case (the POP lane)
        self._pop_lane = None if namesrv else server._pop_lane
        # ... and one plain ACK_MESSAGE / BATCH_ACK_MESSAGE frame is read in C (`_native.ack_frame`) and settled in
        # the checkpoint buffer by `AckMessageProcessor.lane` (BrokerServer._ack_frame: None when not served inline)
        self._ack_frame = None if namesrv else server._ack_frame
        self._ack_args = (self.decoder.max_frame_size, self.decoder.max_header_size, self.decoder._buf)
        # ... and a one-way END_TRANSACTION is served from its bytes (`_native.end_frame`, THE END FRAME), each of
        # those at the head of a read; None when ENDs are not served that way (BrokerServer._end_frame)
        self._end_frame = None if namesrv else server._end_frame
        self._end_args = (server._end_ctx, server._hold_for_send, self.decoder.max_frame_size,
                          self.decoder.max_header_size, self.decoder._buf)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transports are not asyncio's classes
        self.last_active = self.server.loop.time()
        self.remote_address = _format_peer(transport.get_extra_info("peername"))
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.server.connections.add(self)
        self.server.last_connection_change = time.monotonic()

    def data_received(self, data: bytes) -> None:
        server = self.server
        self.last_active = server.loop.time()
        lane = self._frame_lane
        declined = False  # an ACK the lane read and declined: served by the general path, not tried again
        if lane is not None and server.broker.acl is None:
            while True:  # a second round only for what follows the END frames served at the head of the read
                # a read that is one plain SEND_MESSAGE_V2 frame (what a producer waiting for each answer sends) is
                # served from its bytes in one C call; None: not that, nothing done, decoded and handled below
                try:
                    got = lane(data, self.remote_address, self._frame_args)
                except Exception as e:  # as `handle` answers the lane's failure
                    log.exception("request %d failed", _SEND_V2)
                    cmd = self.decoder.feed(data)[0]
                    got = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
                if got is not None:
                    self._write_frame(got if got.__class__ is bytes else
                                      (server._lane_answer(*got) if got.__class__ is tuple else got).encode())
                    return
                ack = self._ack_frame
                if ack is not None:
                    # a read that is one plain ACK_MESSAGE / BATCH_ACK_MESSAGE frame (what a consumer waiting for each
                    # answer sends): its fields read in C; when every ack it names is settled in the checkpoint
                    # buffer the SUCCESS frame C made is the answer, else (None / False: nothing changed) decoded
                    got = ack(data, *self._ack_args)
                    if got is not None:
                        try:
                            done = server._ack_lane(got)
                        except Exception as e:  # as Broker.process answers a processor's failure
                            log.exception("request %d failed", _BATCH_ACK if len(got) == 2 else _ACK)
                            self._write_frame(self.decoder.feed(data)[0].response(
                                ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}").encode())
                            return
                        if done:
                            self._write_frame(got[0])
                            return
                        declined = True
                end = self._end_frame
                if end is None or declined:
                    break
                # one-way END_TRANSACTIONs at the head of the read (a transaction producer's commit, often followed
                # by its next half message in the same read): each served from its bytes in one C call, which
                # gives the position after it; None: not one it serves, nothing done, decoded from there on
                at = 0
                while True:
                    try:
                        got = end(data, at, self._end_args)
                    except Exception:  # as `Broker.process_now` fails: logged, no answer to a one-way request
                        log.exception("request %d failed", _END)
                        # skipped by its length only when the read holds it whole (end_frame raises before it
                        # has checked that only in its one-time set-up); else the decoder's, which keeps the rest
                        got = at + 4 + int.from_bytes(data[at:at + 4], "big")
                        if got > len(data):
                            break
                    if got is None:
                        break
                    at = got
                if not at:
                    break
                if at == len(data):
                    return
                data = data[at:]
        pop = self._pop_lane
        if pop is not None and not declined and server.broker.acl is None:
            decoder = self.decoder
            fields = pop(data, decoder.max_frame_size, decoder.max_header_size, decoder._buf)
            if fields is not None:
                try:
                    got = server._pop_processor.serve_frame(fields)
                except Exception as e:  # as `Broker.process_now` answers a processor's failure
                    cmd = decoder.feed(data)[0]
                    if isinstance(e, (HeaderError, TopicValidationError)):
                        got = cmd.response(ResponseCode.SYSTEM_ERROR, str(e)).encode()
                    else:
                        log.exception("request %d failed", cmd.code)
                        got = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}").encode()
                if got is not None:
                    self._write_frame(got)
                    return
        try:
            commands = self.decoder.feed(data)
        except FrameError as e:
            log.warning("closing connection from %s: malformed frame: %s", self.remote_address, e)
            self.close()
            return
        if len(commands) == 1:
            cmd = commands[0]
            if declined:
                server.serve_general(self, cmd)
            elif not cmd.flag & FLAG_RESPONSE:  # `is_response`, without the property's call
                server.handle(self, cmd)
            return
        # Several requests in one read (a pipelining client): the responses answered at once are gathered
        # and written with one call, one syscall instead of one per response.
        self._out = out = []
        try:
            for cmd in commands:
                if self.closed:
                    return
                if not cmd.is_response:
                    self.server.handle(self, cmd)
        finally:
            self._out = None
            if out:
                self._write_frame(out[0] if len(out) == 1 else b"".join(out))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self.server.last_connection_change = time.monotonic()
        for t in list(self.tasks):
            t.cancel()
        if not self.namesrv:
            try:
                self.server.broker.on_channel_closed(self)
            except Exception:
                log.exception("channel close handling failed")

    def pause_writing(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def write(self, cmd: RemotingCommand) -> None:
        out = self._out
        if out is not None:
            out.append(cmd.encode())
        else:
            self._write_frame(cmd.encode())

    def _write_frame(self, frame: bytes) -> None:
        t = self.transport
        if self.closed or t is None or t.is_closing():
            return
        t.write(frame)
        if t.get_write_buffer_size() > MAX_WRITE_BUFFER:
            log.warning("closing connection from %s: %d bytes of responses unread", self.remote_address,
                        t.get_write_buffer_size())
            self.close()

    def send_oneway(self, cmd: RemotingCommand) -> None:
        """Send a request to the client from any thread (e.g. NOTIFY_CONSUMER_IDS_CHANGED). From the loop's
        own thread (a request served inline) it is written at once, so it precedes the answers written
        after it, whichever loop runs."""
        if threading.get_ident() == self.server.loop_thread_id:
            self.write(cmd)
            return
        with contextlib.suppress(RuntimeError):  # the loop is closed: the connection is gone anyway
            self.server.loop.call_soon_threadsafe(self.write, cmd)

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self.transport.abort()


class BrokerServer:
    """Serves a `Broker` on a broker socket and a name-server socket, on one asyncio loop."""

    def __init__(self, broker: Broker, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 channel_max_idle_seconds: float = 120.0) -> None:
        self.broker = broker
        self.max_frame_size = max_frame_size
        self.channel_max_idle_seconds = channel_max_idle_seconds  # serverChannelMaxIdleTimeSeconds
        self._idle_task: asyncio.Task | None = None
        self.connections: set[Connection] = set()
        self.last_connection_change = time.monotonic()  # a connection opened or closed (idle exit)
        self.loop: asyncio.AbstractEventLoop = None  # type: ignore[assignment]
        self.loop_thread_id = 0  # the thread running `loop`
        self._servers: list[asyncio.AbstractServer] = []
        sync = broker.store.config.flush_disk_type == FlushDiskType.SYNC_FLUSH
        # requests that may wait (a flush, a topic deletion) run on threads, never on the event loop; with
        # SYNC_FLUSH a write waits for the disk, so every write is served on a thread (an END writes too).
        # An END's look-ups of earlier ends read the index through the page cache, as a pull reads the
        # commitlog on the loop; an END that would wait for a lock or the dispatcher goes to a thread.
        self._offload = (_WRITE_CODES | {RequestCode.POP_MESSAGE, _END} if sync else frozenset()) | _BLOCKING_CODES
        self._executor: concurrent.futures.ThreadPoolExecutor | None = concurrent.futures.ThreadPoolExecutor(
            64, "broker-blocking")  # deletions, SYNC_FLUSH writes, ACL-checked requests; never a POP's wait
        # writes served on the loop dispatch their records on the loop too, once the responses of that loop
        # iteration are written (`_hold_dispatch`), instead of waking the dispatch thread for each
        self._reput = broker.store.reput_message_service
        self._inline_writes = _WRITE_CODES - self._offload
        self._dispatch_held = False
        self._send_lane = broker.send_processor.lane
        # the plain send's lane in C (SendMessageProcessor.serve_lane, inline): the response frame in one call
        self._native_lane = NATIVE_LANE
        self._send_inline = _SEND_V2 in self._inline_writes  # SEND_MESSAGE_V2 served on the loop (not SYNC_FLUSH)
        # a read that is one plain SEND_MESSAGE_V2 frame: served from its bytes (Connection.data_received)
        self._frame_lane = NATIVE_FRAME_LANE if self._send_inline else None
        self._lane_ctx = broker.send_processor.lane_context()
        self._lane_answer = broker.send_processor.lane_answer
        # the POP lane (Connection.data_received): POPs served on the loop (not SYNC_FLUSH), the native reader there
        self._pop_processor = broker.processor_for(RequestCode.POP_MESSAGE)
        # a POP that must wait is held on the loop (`_pop_hold`) when the stock processor serves POPs both ways
        self._pop_holds = (type(self._pop_processor) is PopMessageProcessor
                           and broker.quick_processor_for(_POP) is self._pop_processor)
        self.pop_held = 0  # POPs held now (`_pop_hold`; read and changed on the loop only)
        self._pop_held_by: dict[tuple[str, str, str], int] = {}  # ... by (topic, group, queue id)
        self._pop_lane = (POP_FRAME if RequestCode.POP_MESSAGE not in self._offload
                          and isinstance(self._pop_processor, PopMessageProcessor) else None)
        # acks served on the loop (not SYNC_FLUSH): the usual ones by `AckMessageProcessor.lane`, from the frame's
        # bytes (`Connection.data_received`) or from a decoded BATCH_ACK's body (`handle`); ACL on: never
        # (the processor registered for both codes: one that replaced AckMessageProcessor gets no lane)
        acker = broker.processor_for(_ACK)
        self._ack_lane = getattr(acker, "lane", None)
        ack_inline = (_ACK in self._inline_writes and _BATCH_ACK in self._inline_writes and self._ack_lane is not None
                      and broker.processor_for(_BATCH_ACK) is acker)
        self._ack_frame = ACK_FRAME if ack_inline and self._frame_lane is not None else None
        self._ack_body = ACK_BODY if ack_inline else None
        # a one-way END_TRANSACTION served from its bytes (Connection.data_received, THE END FRAME): ENDs served on
        # the loop (not SYNC_FLUSH), by the stock processor `process_now` would call
        ender = broker.quick_processor_for(_END)
        self._end_frame = (END_FRAME if self._frame_lane is not None and _END not in self._offload
                           and type(ender) is EndTransactionProcessor else None)
        self._end_ctx = ender.frame_context() if self._end_frame is not None else None

    async def start(self, broker_sock: socket.socket, namesrv_sock: socket.socket | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.loop_thread_id = threading.get_ident()
        self._servers.append(await self.loop.create_server(lambda: Connection(self, False), sock=broker_sock))
        if namesrv_sock is not None:
            self._servers.append(await self.loop.create_server(lambda: Connection(self, True), sock=namesrv_sock))
        if self.channel_max_idle_seconds > 0:
            self._idle_task = self.loop.create_task(self._close_idle_connections())

    def idle_seconds(self) -> float:
        """How long no client connection (broker or name-server port) has been open; 0 while one is."""
        if self.connections:
            return 0.0
        return time.monotonic() - self.last_connection_change

    async def _close_idle_connections(self) -> None:
        """Close connections that sent nothing for `channel_max_idle_seconds` and wait for nothing (a
        held pull keeps its connection), as Netty's IdleStateHandler does for the Java broker."""
        limit = self.channel_max_idle_seconds
        while True:
            await asyncio.sleep(min(10.0, limit / 2))
            now = self.loop.time()
            for c in list(self.connections):
                if not c.tasks and now - c.last_active > limit:
                    log.info("closing idle connection from %s", c.remote_address)
                    c.close()

    async def stop(self) -> None:
        if self._idle_task is not None:
            self._idle_task.cancel()
        for s in self._servers:
            s.close()
        for c in list(self.connections):
            c.close()
        tasks = [t for c in list(self.connections) for t in c.tasks]
        for t in tasks:
            t.cancel()
        for s in self._servers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(s.wait_closed(), 2)
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def handle(self, conn: Connection, cmd: RemotingCommand) -> None:
        broker = self.broker
        if cmd.code == _SEND_V2 and self._send_inline and not conn.namesrv:  # first: what producers send
            if not self._dispatch_held and self._reput.hold_wakeups():  # `_hold_dispatch`, inline
                self._dispatch_held = True
                self.loop.call_soon(self._dispatch_here)
            if broker.acl is None:  # a plain send: the short path when it serves it
                try:  # the C lane first (the response frame, or None: not its to serve), then the Python one
                    native = self._native_lane
                    result = native(cmd, conn.remote_address, self._lane_ctx) if native is not None else None
                    if result is None:
                        result = self._send_lane(cmd, conn)
                    elif result.__class__ is bytes:
                        if not cmd.flag & FLAG_ONEWAY:  # `is_oneway`, without the property's call
                            out = conn._out
                            if out is not None:
                                out.append(result)
                            else:
                                conn._write_frame(result)
                        return
                    else:  # stored or refused, answered by the Python lane's code
                        result = self._lane_answer(*result)
                except Exception as e:  # as Broker.process answers a processor's failure
                    log.exception("request %d failed", cmd.code)
                    result = cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
                if result is not None:
                    if not cmd.flag & FLAG_ONEWAY:
                        conn.write(result)
                    return
            self._respond(conn, cmd, broker.process(cmd, conn))
        elif conn.namesrv:
            self._respond(conn, cmd, broker.process_namesrv(cmd, conn))
        elif cmd.code in self._offload:
            self._spawn(conn, self._offloaded(conn, cmd))
        elif cmd.code == _BATCH_ACK and self._ack_body is not None and broker.acl is None:
            # a decoded BATCH_ACK (e.g. pipelined before a POP): the usual one settled by the lane, else as below
            entries = self._ack_body(cmd.body)
            if entries is not None:
                try:
                    done = self._ack_lane((None, entries))
                except Exception as e:  # as Broker.process answers a processor's failure
                    log.exception("request %d failed", cmd.code)
                    done, result = False, cmd.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")
                    if not cmd.flag & FLAG_ONEWAY:
                        conn.write(result)
                    return
                if done:
                    if not cmd.flag & FLAG_ONEWAY:
                        conn.write(cmd.response())
                    return
            self.serve_general(conn, cmd)
        elif cmd.code in self._inline_writes:
            if not self._dispatch_held:
                self._hold_dispatch()
            self._respond(conn, cmd, broker.process(cmd, conn))
        elif cmd.code in _QUICK_FIRST_CODES:  # at once when that cannot block, else on a thread
            if cmd.code == _END and not self._dispatch_held:  # its records are dispatched here too, as a send's
                self._hold_dispatch()
            seen = self._reput.dispatched_offset  # before the look: a POP held below compares it
            result = broker.process_now(cmd, conn)
            if result is None:
                if cmd.code == _POP and self._pop_holds and broker.acl is None:
                    self._spawn(conn, self._pop_hold(conn, cmd, seen, False))
                else:
                    self._spawn(conn, self._offloaded(conn, cmd))
            elif not cmd.is_oneway:
                conn.write(result)
        else:
            self._respond(conn, cmd, broker.process(cmd, conn))

    def serve_general(self, conn: Connection, cmd: RemotingCommand) -> None:
        """A request served as `handle` serves a write on the loop (an ack the lane declined)."""
        if not self._dispatch_held:
            self._hold_dispatch()
        self._respond(conn, cmd, self.broker.process(cmd, conn))

    def _hold_for_send(self) -> None:
        """What `handle` does before a send it serves on the loop: the dispatch held for this iteration."""
        if not self._dispatch_held and self._reput.hold_wakeups():
            self._dispatch_held = True
            self.loop.call_soon(self._dispatch_here)

    def _hold_dispatch(self) -> None:
        """A write is served on the loop: its records (and those of the other writes of this loop iteration)
        are dispatched on the loop right after, in one pass, rather than by waking the dispatch thread
        (a futex wake-up and two GIL hand-offs per lone send; the thread still takes what is left)."""
        if self._reput.hold_wakeups():
            self._dispatch_held = True
            self.loop.call_soon(self._dispatch_here)

    def _dispatch_here(self) -> None:
        self._dispatch_held = False
        self._reput.dispatch_here()

    def _respond(self, conn: Connection, cmd: RemotingCommand, result: RemotingCommand | PullHold) -> None:
        if isinstance(result, PullHold):
            self._spawn(conn, self._hold(conn, result))
        elif not cmd.is_oneway:
            conn.write(result)

    def _spawn(self, conn: Connection, coro: Any) -> None:
        task = self.loop.create_task(coro)
        conn.tasks.add(task)
        task.add_done_callback(conn.tasks.discard)

    async def _offloaded(self, conn: Connection, cmd: RemotingCommand) -> None:
        if cmd.code == _POP and self._pop_holds:  # looked at on a thread, held (if it must wait) on the loop
            seen = self._reput.dispatched_offset
            result = await self._in_thread(cmd, self.broker.process, cmd, conn, False)
            if result is None:
                await self._pop_hold(conn, cmd, seen, True)
                return
        else:
            result = await self._in_thread(cmd, self.broker.process, cmd, conn)
        self._answer(conn, cmd, result)

    def _answer(self, conn: Connection, cmd: RemotingCommand, result: Any) -> None:
        """A result served off the loop's first pass: responded, or, its connection gone meanwhile, given back
        (`_undelivered`)."""
        if conn.closed or conn.transport is None or conn.transport.is_closing():
            self._undelivered(cmd, result)
        elif result is not None:
            self._respond(conn, cmd, result)

    async def _in_thread(self, cmd: RemotingCommand, fn: Any, *args: Any) -> Any:
        """`fn(*args)` on a worker thread. The request goes on if its connection closes meanwhile (this task is
        cancelled, `connection_lost`): its answer then finds nobody and goes to `_undelivered`."""
        fut = self.loop.run_in_executor(self._executor, fn, *args)
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            fut.add_done_callback(lambda f: None if f.cancelled() or f.exception() is not None
                                  else self._undelivered(cmd, f.result()))
            raise

    def _pop_look(self, cmd: RemotingCommand, conn: Connection, final: bool) -> RemotingCommand | None:
        """A held POP looked at again (no ACL check: its first look had it): its answer, or None when it found
        nothing and its poll time goes on; `final`: POLLING_TIMEOUT then."""
        return self.broker.serve_quick(cmd, conn, final=final)

    async def _pop_hold(self, conn: Connection, cmd: RemotingCommand, seen: int, in_thread: bool) -> None:
        """A POP that found nothing and may wait (`pollTime`), held on the loop until its poll time ends: it is
        counted as waiting on its topic and its pop retry topic (`PopService.add_arrival_waiter`), and each
        arrival there (or every POP_RELOOK_SECONDS) looks again, on the loop, or on a worker thread when
        `in_thread` (SYNC_FLUSH: a pop writes with the flush wait). No thread waits, so any number of POPs may
        be held (RocketMQ's PopLongPollingService parks them likewise). `seen`: the dispatched offset before
        the look that found nothing; records dispatched since then are looked for at once. A connection gone
        stops the hold before anything more is popped for it; a POP answered after it closed is given back."""
        loop = self.loop
        pops = self.broker.pop_service
        reput = self._reput
        cfg = self.broker.config
        deadline = loop.time() + self._pop_processor.poll_ms(cmd) / 1000.0
        x = cmd.ext_fields
        group, topic = str(x.get("consumerGroup")), str(x.get("topic"))
        key = (topic, group, str(x.get("queueId")))
        held = self._pop_held_by.get(key, 0)
        if self.pop_held >= cfg.max_pop_polling_size or held >= cfg.pop_polling_size:
            # full (RocketMQ's POLLING_FULL): looked at once more, answered at once
            result = await self._in_thread(cmd, self._pop_look, cmd, conn, True) if in_thread \
                else self._pop_look(cmd, conn, True)
            if result is not None and result.code == _POLLING_TIMEOUT:
                result.code, result.remark = _POLLING_FULL, (
                    f"{self.pop_held} POPs held in all (max_pop_polling_size {cfg.max_pop_polling_size}), "
                    f"{held} on this queue (pop_polling_size {cfg.pop_polling_size})")
                log.info("POP of %s on %s answered POLLING_FULL: %s", group, topic, result.remark)
            self._answer(conn, cmd, result)
            return
        self.pop_held += 1
        self._pop_held_by[key] = held + 1
        waker = _LoopWaker(loop)
        topics = pops.add_arrival_waiter(group, topic, waker)
        result = None
        try:
            look_now = reput.dispatched_offset != seen  # dispatched before the waiter was counted
            while result is None:
                if not look_now and not waker.fut.done():
                    remaining = deadline - loop.time()
                    if remaining > 0 and not pops.stopped:
                        await asyncio.wait([waker.fut], timeout=min(remaining, POP_RELOOK_SECONDS))
                look_now = False
                if conn.closed:
                    return  # nothing popped for a client that left
                waker.rearm()  # an arrival from here on wakes the next wait
                final = loop.time() >= deadline or pops.stopped
                if in_thread:
                    result = await self._in_thread(cmd, self._pop_look, cmd, conn, final)
                else:
                    result = self._pop_look(cmd, conn, final)
        finally:
            pops.remove_arrival_waiter(topics, waker)
            self.pop_held -= 1
            n = self._pop_held_by[key] - 1
            if n:
                self._pop_held_by[key] = n
            else:
                del self._pop_held_by[key]
        self._answer(conn, cmd, result)

    def _undelivered(self, cmd: RemotingCommand, result: Any) -> None:
        """A response that cannot be written (its connection closed while the request was served, e.g. a
        POP long poll that found messages after its client left): what it handed out is given back at
        once (`give_back_popped`), on a worker thread, rather than left invisible for its invisible time."""
        if cmd.code != RequestCode.POP_MESSAGE or not isinstance(result, RemotingCommand):
            return

        def give_back() -> None:
            n = give_back_popped(self.broker, cmd, result)
            if n:
                log.info("gave back %d messages popped for a connection closed meanwhile", n)

        executor = self._executor
        try:
            if executor is None:
                raise RuntimeError("no executor")
            executor.submit(give_back)
        except RuntimeError:  # shutting down: give back in this thread
            give_back()

    async def _hold(self, conn: Connection, hold: PullHold) -> None:
        loop = self.loop
        fut: asyncio.Future = loop.create_future()

        def _set() -> None:
            if not fut.done():
                fut.set_result(None)

        def wake() -> None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_set)

        handle = self.broker.wait_for_arrival(hold, wake)
        try:
            await asyncio.wait([fut], timeout=hold.timeout_ms / 1000.0)
        finally:
            self.broker.hold_service.cancel(handle)
        if conn.closed:
            return
        result = self.broker.process_pull(hold.request, conn, allow_suspend=False)
        if isinstance(result, RemotingCommand):
            conn.write(result)


class _LoopWaker:
    """What a POP held on the loop waits on: `set()` (any thread: `PopService._on_arrival` on the dispatching
    thread, under its lock) completes `fut` on the loop; `rearm()` makes a new `fut` once that one is done.
    Arrivals while a wake is already on its way to the loop schedule nothing more. An arrival dispatched on the
    loop's own thread (a send served there, `_dispatch_here`) completes `fut` at once: the waiting task is
    scheduled by that, without the self-pipe write and extra loop pass `call_soon_threadsafe` costs."""

    __slots__ = ("loop", "fut", "_queued", "_thread")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.fut: asyncio.Future = loop.create_future()
        self._queued = False
        self._thread = threading.get_ident()  # made on the loop's thread (`_pop_hold`)

    def set(self) -> None:
        if self._queued:
            return
        if threading.get_ident() == self._thread:
            if not self.fut.done():
                self.fut.set_result(None)
            return
        self._queued = True
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            self.loop.call_soon_threadsafe(self._fire)

    def _fire(self) -> None:
        self._queued = False
        if not self.fut.done():
            self.fut.set_result(None)

    def rearm(self) -> None:
        if self.fut.done():
            self.fut = self.loop.create_future()


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family, backlog=1024)


def _advertised(host: str, port: int) -> str:
    """The `ip:port` clients are told to use (and records carry as their store host)."""
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    try:
        ipaddress.ip_address(host)
    except ValueError:
        host = socket.gethostbyname(host)  # a name: the records need an address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class RunningBroker:
    """A broker serving on a background thread (`serve_in_thread`): addresses, the `Broker`, its
    `MessageStore`, and `close()` (clean shutdown, idempotent; also a context manager). `announced` tells
    whether `<store>/broker.json` names this broker."""

    def __init__(self, store: MessageStore, broker: Broker, server: BrokerServer, loop: asyncio.AbstractEventLoop,
                 thread: threading.Thread, namesrv_address: str, broker_address: str) -> None:
        self.store = store
        self.store_path = store.config.store_path_root_dir
        self.announced = False
        self.broker = broker
        self.server = server
        self.loop = loop
        self.thread = thread
        self.namesrv_address = namesrv_address
        self.broker_address = broker_address
        self.event_loop = "asyncio"  # which loop implementation serves ("uvloop 0.x" or "asyncio")
        self._closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> RunningBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def announce(self) -> None:
        """Write `<store>/broker.json` naming this broker (atomically); a failure is logged, not raised:
        the broker serves, it is only not found by other processes."""
        try:
            write_broker_file(self.store_path, pid=os.getpid(), namesrv=self.namesrv_address,
                              broker=self.broker_address, started_ms=int(time.time() * 1000))
            self.announced = True
        except OSError as e:
            log.warning("could not announce the broker in %s/broker.json: %s", self.store_path, e)

    def close(self) -> None:
        """Remove our `broker.json`, stop accepting, drop connections, stop the broker's threads, persist
        offsets, shut the store."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            if self.announced:  # first, so that nobody finds a broker that is going away
                self.announced = False
                try:
                    remove_broker_file_if_ours(self.store_path, os.getpid(), self.namesrv_address)
                except OSError as e:
                    log.warning("could not remove %s/broker.json: %s", self.store_path, e)
            if self.loop.is_running():
                fut = asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop)
                try:
                    fut.result(15)
                except Exception:
                    log.exception("stopping the server failed")
                self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=15)
        finally:
            try:
                self.broker.shutdown()
            finally:
                self.store.shutdown()


def serve_in_thread(store_path: str | os.PathLike[str], host: str = "127.0.0.1", namesrv_port: int = 0,
                    broker_port: int = 0, *, announce: bool = True, **store_config: Any) -> RunningBroker:
    """Open the store at `store_path`, start a `Broker` on it and serve it on a background thread.

    `store_config` holds `StoreConfig` fields; `BrokerConfig` fields (e.g. `auto_create_topic_enable`,
    `broker_name`), `max_frame_size`, `channel_max_idle_seconds` and `event_loop` ("auto", "uvloop",
    "asyncio"; see `new_event_loop`) are picked out of it. `store_host` defaults to the broker's listen
    address (or `broker_ip1`, RocketMQ's brokerIP1, the address it registers with the name server)
    so that records and offsetMsgIds carry it; `enabled_append_prop_crc` and `force_verify_prop_crc`
    default to on. Port 0 picks a free port. With `announce`
    (the default) the broker writes `<store>/broker.json` once it serves, with the real addresses.
    """
    broker_kw = {k: store_config.pop(k) for k in list(store_config) if k in BrokerConfig.field_names()}
    if broker_kw.get("message_delay_level"):  # the store writes delivery times with the same levels
        store_config["message_delay_level"] = broker_kw["message_delay_level"]
    max_frame = int(store_config.pop("max_frame_size", DEFAULT_MAX_FRAME_SIZE))
    max_idle = float(store_config.pop("channel_max_idle_seconds", 120.0))
    loop_kind = store_config.pop("event_loop", None)
    loop, loop_name = new_event_loop(loop_kind)  # a bad name fails before any socket is bound
    try:
        bsock = _bind(host, broker_port)
    except BaseException:
        loop.close()
        raise
    try:
        nsock = _bind(host, namesrv_port)
    except BaseException:
        bsock.close()
        loop.close()
        raise
    broker_address = _advertised(broker_kw.get("broker_ip1") or host, bsock.getsockname()[1])
    namesrv_address = _advertised(host, nsock.getsockname()[1])
    store_config.setdefault("store_host", broker_address)
    # Our broker writes and checks RocketMQ 5.2's `__CRC32#` property unless told otherwise (DESIGN.md,
    # "The properties CRC"); the store's own defaults stay RocketMQ's (off).
    store_config.setdefault("enabled_append_prop_crc", True)
    store_config.setdefault("force_verify_prop_crc", True)
    store = None
    broker = None
    try:
        store = MessageStore(StoreConfig(store_path_root_dir=os.fspath(store_path), **store_config))
        store.load()
        store.start()
        broker = Broker(store, BrokerConfig(**broker_kw), broker_address)
        broker.start()
        server = BrokerServer(broker, max_frame, max_idle)
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                with contextlib.suppress(Exception):
                    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
                    for t in pending:
                        t.cancel()
                    if pending:
                        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
                loop.close()

        thread = threading.Thread(target=run, name=f"broker-{broker_address}", daemon=True)
        thread.start()
        ready.wait(10)
        asyncio.run_coroutine_threadsafe(server.start(bsock, nsock), loop).result(10)
    except BaseException:
        bsock.close()
        nsock.close()
        if loop.is_running():
            loop.call_soon_threadsafe(loop.stop)
        elif not loop.is_closed():
            loop.close()
        if broker is not None:
            broker.shutdown()
        if store is not None:
            store.shutdown()
        raise
    log.info("broker %s serving %s (name server %s, event loop %s)", broker_address, store_path, namesrv_address,
             loop_name)
    running = RunningBroker(store, broker, server, loop, thread, namesrv_address, broker_address)
    running.event_loop = loop_name
    if announce:
        running.announce()
    return running
