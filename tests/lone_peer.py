"""A scripted remoting peer for the client's connection tests: it accepts connections, records every request
frame it reads, and answers each with what `answer(frame)` gives (bytes written as they are, in pieces when a
list, nothing for None, the connection closed for CLOSE)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable

from rmq_eventstore.remoting import FLAG_RESPONSE, FrameDecoder, RemotingCommand

CLOSE = object()


def reply(frame: bytes, code: int = 0, ext: dict[str, str] | None = None, body: bytes = b"") -> bytes:
    """The response frame a Java broker writes (Python codec) to the request `frame`, echoing its opaque."""
    (req,) = FrameDecoder().feed(frame)
    return RemotingCommand(code, ext if ext is not None else {"echo": str(req.opaque)}, body, req.opaque,
                           FLAG_RESPONSE, None, "JAVA").encode_py()


class Peer:
    """`address` answers request frames with `answer(frame)`; `frames` holds what it read, in order."""

    def __init__(self, answer: Callable[[bytes], object] = reply) -> None:
        self.answer = answer
        self.frames: list[bytes] = []
        self._srv = socket.create_server(("127.0.0.1", 0))
        self._srv.settimeout(0.1)
        self._stop = threading.Event()
        self._conns: list[socket.socket] = []
        self.address = f"127.0.0.1:{self._srv.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                c, _ = self._srv.accept()
            except OSError:
                continue
            self._conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c: socket.socket) -> None:
        buf = b""
        try:
            while not self._stop.is_set():
                data = c.recv(65536)
                if not data:
                    return
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    n = 4 + int.from_bytes(buf[:4], "big")
                    frame, buf = buf[:n], buf[n:]
                    self.frames.append(frame)
                    out = self.answer(frame)
                    if out is CLOSE:
                        c.close()
                        return
                    for piece in (out if isinstance(out, list) else [out] if out else []):
                        c.sendall(piece)
                        if isinstance(out, list):
                            time.sleep(0.05)
        except OSError:
            return

    def close(self) -> None:
        self._stop.set()
        for c in self._conns:
            try:
                c.close()
            except OSError:
                pass
        self._srv.close()
