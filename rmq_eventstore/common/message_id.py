"""Message ids: host text (`a.b.c.d:port`, `[v6]:port`), the broker's offsetMsgId (store host + port +
commitlog offset) and the client's UNIQ_KEY (`MessageClientIDSetter`)."""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
import threading
import time
from datetime import datetime
from functools import lru_cache

from .native import native
from .rng import rng
from .tags import _to_signed32

_native_uniq = getattr(native, "uniq_create", None)  # create()'s fast path in C, or None

_ID_TAIL = struct.Struct(">iq")  # port + offset in a message id
_HEX2 = [f"{i:02X}" for i in range(256)]  # a counter's two bytes as text: cheaper than `{c:04X}` per id


# -- hosts ------------------------------------------------------------------------------------------
@lru_cache(maxsize=4096)
def parse_host(host: str) -> tuple[bytes, int]:
    """`"ip:port"` or `"[v6]:port"` → (4- or 16-byte address, port); IPv4-mapped IPv6 becomes IPv4."""
    h = host.strip()
    if h.startswith("["):
        end = h.find("]")
        if end < 0 or not h[end + 1:].startswith(":"):
            raise ValueError(f"bad host {host!r}: expected [ipv6]:port")
        addr_s, port_s = h[1:end], h[end + 2:]
    else:
        addr_s, sep, port_s = h.rpartition(":")
        if not sep:
            raise ValueError(f"bad host {host!r}: expected ip:port")
    try:
        port = int(port_s)
        ip = ipaddress.ip_address(addr_s.split("%")[0])
    except ValueError as e:
        raise ValueError(f"bad host {host!r}: {e}") from None
    if not 0 <= port <= 0xFFFFFFFF:
        raise ValueError(f"bad host {host!r}: port out of range")
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if port >= 0x80000000:
        port -= 0x100000000
    return ip.packed, port


_V4_MAPPED_PREFIX = bytes(10) + b"\xff\xff"


def format_host(addr: bytes, port: int) -> str:
    """Java's text for a socket address: `a.b.c.d:port` or `[x:x:x:x:x:x:x:x]:port` (no zero compression)."""
    if len(addr) == 16 and addr[:12] == _V4_MAPPED_PREFIX:
        addr = addr[12:]  # InetAddress.getByAddress turns an IPv4-mapped IPv6 address into an Inet4Address
    if len(addr) == 4:
        return f"{addr[0]}.{addr[1]}.{addr[2]}.{addr[3]}:{port}"
    groups = struct.unpack(">8H", addr)
    return "[" + ":".join(f"{g:x}" for g in groups) + f"]:{port}"


# -- message ids ------------------------------------------------------------------------------------
def create_message_id(store_host: bytes, port: int, commit_log_offset: int) -> str:
    """offsetMsgId: store address + port (int) + commitlog offset (long), upper-case hex (spec §3.1)."""
    return (store_host + _ID_TAIL.pack(port, commit_log_offset)).hex().upper()


def join_message_ids(store_host: bytes, port: int, offsets: list[int]) -> str:
    """A batch's offsetMsgIds, comma-joined as RocketMQ answers them (`join_message_ids_py`, the reference;
    the C loop of `_native` when active)."""
    if _native_join is not None:
        r = _native_join(store_host, port, offsets)
        if r is not None:
            return r
    return join_message_ids_py(store_host, port, offsets)


_native_join = getattr(native, "join_message_ids", None) if native is not None else None  # looked up once


def join_message_ids_py(store_host: bytes, port: int, offsets: list[int]) -> str:
    """`join_message_ids` in Python."""
    return ",".join([create_message_id(store_host, port, o) for o in offsets])


class MessageIdError(ValueError):
    """A message id that is not 32 or 56 hex characters."""


def decode_message_id(msg_id: str) -> tuple[bytes, int, int]:
    """offsetMsgId → (store address bytes, port, commitlog offset)."""
    s = msg_id.strip()
    if len(s) not in (32, 56):
        raise MessageIdError(f"message id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters")
    try:
        raw = bytes.fromhex(s)
    except ValueError:
        raise MessageIdError(f"message id {msg_id!r} is not hexadecimal") from None
    ip_len = 4 if len(s) == 32 else 16
    port, offset = _ID_TAIL.unpack_from(raw, ip_len)
    return raw[:ip_len], port, offset


def _start_of_month_ms(now_ms: int) -> int:
    dt = datetime.fromtimestamp(now_ms / 1000.0)
    start = dt.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return int(start.timestamp() * 1000)


def _local_ip() -> bytes:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: UDP connect only picks a route
            return socket.inet_aton(s.getsockname()[0])
    except OSError:
        return socket.inet_aton("127.0.0.1")


class UniqueIdGenerator:
    """`MessageClientIDSetter`: UNIQ_KEY = ip(4|16) + pid(2) + random(4) + ms since month start(4) + counter(2).

    The first three fields are a per-process prefix; ids are 32 upper-case hex characters for IPv4.
    Its state is in slots, which `_native.uniq_create` (a single put's id) reads and writes by offset
    instead of by attribute look-up.
    """

    __slots__ = ("_ip", "_pid", "_salt", "_prefix", "_counter", "_lock", "_month_start", "_next_month", "_time",
                 "_time_used", "_head", "_head_time")

    def __init__(self, ip: bytes | None = None, pid: int | None = None) -> None:
        self._ip = ip if ip is not None else _local_ip()
        self._pid = (os.getpid() if pid is None else pid) & 0xFFFF
        self._salt = rng.getrandbits(32)
        self._prefix = (self._ip + struct.pack(">Hi", self._pid, _to_signed32(self._salt))).hex().upper()
        self._counter = rng.getrandbits(16)
        self._lock = threading.Lock()
        self._month_start = 0
        self._next_month = 0
        self._time = 0  # ms stamped into the ids being issued; never goes backwards
        self._time_used = 0  # ids issued with self._time (at 65536 the 16-bit counter would repeat)
        self._head = ""  # the id text up to the counter for the millisecond _head_time (create's fast path)
        self._head_time = -1

    def _roll_month(self, now: int) -> None:
        self._month_start = _start_of_month_ms(now)
        dt = datetime.fromtimestamp(self._month_start / 1000.0)
        nxt = dt.replace(year=dt.year + (dt.month == 12), month=dt.month % 12 + 1)
        self._next_month = int(nxt.timestamp() * 1000)

    def _claim(self, n: int) -> list[tuple[str, int, int]]:
        """Claim `n` ids: runs of (hex up to the counter, first counter, count).

        An id is unique by (millisecond, counter). Once 65536 ids share a millisecond, the next ones are
        stamped with the following millisecond (a large burst borrows a few ms) rather than repeat a counter.
        """
        now = int(time.time() * 1000)
        runs = []
        with self._lock:
            if now > self._time:
                self._time, self._time_used = now, 0
            while n > 0:
                if self._time_used >= 0x10000:
                    self._time, self._time_used = self._time + 1, 0
                t = self._time
                if t >= self._next_month or t < self._month_start:
                    self._roll_month(t)
                k = min(n, 0x10000 - self._time_used)
                head = f"{self._prefix}{(t - self._month_start) & 0xFFFFFFFF:08X}"
                self._head, self._head_time = head, t
                runs.append((head, self._counter, k))
                self._counter = (self._counter + k) & 0xFFFF
                self._time_used += k
                n -= k
        return runs

    def create(self) -> str:
        if _native_uniq is not None:  # the same fast path in C (the producer's and the broker's ids)
            uid = _native_uniq(self)
            if uid is not None:
                return uid
        now = int(time.time() * 1000)
        with self._lock:  # the fast path of _claim(1): same millisecond (or a later one) as the last claim
            if now > self._time:
                self._time, self._time_used = now, 0
            if self._time == self._head_time and self._time_used < 0x10000:
                c = self._counter
                self._counter = (c + 1) & 0xFFFF
                self._time_used += 1
                return f"{self._head}{_HEX2[c >> 8]}{_HEX2[c & 0xFF]}"  # f"{self._head}{c:04X}"
        ((head, c, _),) = self._claim(1)
        return f"{head}{c:04X}"

    def create_many(self, n: int) -> list[str]:
        out: list[str] = []
        for head, c0, k in self._claim(n):
            ids = native.format_ids(head, c0, k) if native is not None else None
            out += ids if ids is not None else [f"{head}{(c0 + i) & 0xFFFF:04X}" for i in range(k)]
        return out

    @staticmethod
    def get_ip_bytes(uniq_key: str) -> bytes:
        raw = bytes.fromhex(uniq_key)
        return raw[: len(raw) - 12]

    @staticmethod
    def get_pid(uniq_key: str) -> int:
        raw = bytes.fromhex(uniq_key)
        return struct.unpack_from(">H", raw, len(raw) - 12)[0]

    @staticmethod
    def get_nearly_time_ms(uniq_key: str, now_ms: int | None = None) -> int:
        """Born time recovered from the id: month start + the 4-byte diff (previous month if in the future)."""
        raw = bytes.fromhex(uniq_key)
        diff = struct.unpack_from(">I", raw, len(raw) - 6)[0]
        now = int(time.time() * 1000) if now_ms is None else now_ms
        start = _start_of_month_ms(now)
        t = start + diff
        if t > now:
            prev = datetime.fromtimestamp(start / 1000.0)
            prev = prev.replace(year=prev.year - (prev.month == 1), month=(prev.month - 2) % 12 + 1)
            t = int(prev.timestamp() * 1000) + diff
        return t
