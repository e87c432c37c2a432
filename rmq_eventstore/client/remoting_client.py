"""A synchronous, thread-safe remoting client: one TCP connection per address, requests matched to
responses by `opaque` on a background reader thread (`NettyRemotingClient`, without Netty).

Any number of threads (Django views, Celery workers) may `invoke` on the same connection at once; each
waits only for its own response, so a long-polling pull never delays a send.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable

from ..remoting import FrameDecoder, FrameError, RemotingCommand, ResponseCode

log = logging.getLogger(__name__)

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
    __slots__ = ("event", "response", "error")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.response: RemotingCommand | None = None
        self.error: Exception | None = None


class ClientConnection:
    """One connection: `invoke` (blocking, thread-safe), `invoke_oneway`, a reader thread."""

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
        self._pending_lock = threading.Lock()
        self._on_request = on_request
        self.closed = False
        self._reader = threading.Thread(target=self._read_loop, name=f"remoting-reader-{address}", daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        decoder = FrameDecoder(CLIENT_MAX_FRAME_SIZE, CLIENT_MAX_FRAME_SIZE)
        error: Exception = RemotingError(f"connection to {self.address} closed")
        try:
            while True:
                data = self.sock.recv(1 << 18)
                if not data:
                    break
                for cmd in decoder.feed(data):
                    if cmd.is_response:
                        with self._pending_lock:
                            slot = self._pending.pop(cmd.opaque, None)
                        if slot is not None:
                            slot.response = cmd
                            slot.event.set()
                    elif self._on_request is not None:
                        try:
                            self._on_request(cmd)
                        except Exception:
                            log.exception("handling a request from %s failed", self.address)
        except FrameError as e:
            error = RemotingError(f"malformed frame from {self.address}: {e}")
            log.warning("%s", error)
        except OSError as e:
            if not self.closed:
                error = RemotingError(f"connection to {self.address} lost: {e}")
        finally:
            self.closed = True
            with self._pending_lock:
                pending, self._pending = self._pending, {}
            for slot in pending.values():
                slot.error = error
                slot.event.set()
            try:
                self.sock.close()
            except OSError:
                pass

    def _send(self, frame: bytes) -> None:
        try:
            with self._send_lock:
                self.sock.sendall(frame)
        except OSError as e:
            self.close()
            raise RemotingError(f"send to {self.address} failed: {e}") from e

    def invoke(self, cmd: RemotingCommand, timeout: float) -> RemotingCommand:
        """Send a request and wait for its response (raises `RemotingError` on failure or timeout)."""
        if self.closed:
            raise RemotingError(f"connection to {self.address} is closed")
        slot = _Pending()
        with self._pending_lock:
            self._pending[cmd.opaque] = slot
        try:
            self._send(cmd.encode())
        except RemotingError:
            with self._pending_lock:
                self._pending.pop(cmd.opaque, None)
            raise
        if not slot.event.wait(timeout):
            with self._pending_lock:
                self._pending.pop(cmd.opaque, None)
            raise RemotingTimeoutError(f"no response from {self.address} to request {cmd.code} in {timeout:.1f}s")
        if slot.error is not None:
            raise slot.error
        assert slot.response is not None
        return slot.response

    def invoke_oneway(self, cmd: RemotingCommand) -> None:
        cmd.flag |= 0x2
        self._send(cmd.encode())

    def close(self) -> None:
        if self.closed and not self._reader.is_alive():
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        if threading.current_thread() is not self._reader:
            self._reader.join(timeout=5)


class RemotingClient:
    """Connections by address, created on first use and re-created after a failure (thread-safe)."""

    def __init__(self, connect_timeout: float = 3.0,
                 on_request: Callable[[str, RemotingCommand], None] | None = None) -> None:
        self.connect_timeout = connect_timeout
        self._on_request = on_request
        self._conns: dict[str, ClientConnection] = {}
        self._lock = threading.Lock()
        self._closed = False

    def connection(self, address: str) -> ClientConnection:
        c = self._conns.get(address)
        if c is not None and not c.closed:
            return c
        with self._lock:
            if self._closed:
                raise RemotingError("client is shut down")
            c = self._conns.get(address)
            if c is None or c.closed:
                cb = self._on_request
                c = ClientConnection(address, self.connect_timeout,
                                     (lambda cmd, a=address: cb(a, cmd)) if cb is not None else None)
                self._conns[address] = c
            return c

    def invoke(self, address: str, cmd: RemotingCommand, timeout: float = 3.0) -> RemotingCommand:
        return self.connection(address).invoke(cmd, timeout)

    def invoke_oneway(self, address: str, cmd: RemotingCommand) -> None:
        self.connection(address).invoke_oneway(cmd)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            conns, self._conns = list(self._conns.values()), {}
        for c in conns:
            c.close()
