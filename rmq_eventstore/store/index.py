"""IndexFile and IndexService: the `topic#key` → commitlog offset hash index (spec §7).

An index file is a hash table laid out on disk (big-endian):

    header (40 B): beginTimestamp q | endTimestamp q | beginPhyOffset q | endPhyOffset q |
                   hashSlotCount i | indexCount i
    slot table:    hashSlotNum ints, each the number of the newest entry of that slot's chain (0 = empty)
    entries:       indexNum × [keyHash i | phyOffset q | timeDiff i (seconds from beginTimestamp) |
                   prevIndex i]

Entry 0 and slot value 0 are sentinels, so a file holds at most `indexNum - 1` entries. Files live in
`<root>/index/` and are named after their creation time (`yyyyMMddHHmmssSSS`, local time).

The index stores hashes only (`abs(String.hashCode)` of `topic#key`): a query returns every entry whose
hash equals the key's, so callers must read the messages and compare the real keys (RocketMQ issue #3613).
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import NamedTuple

import numpy as np

from ..common import codec
from ..common.codec import (
    KEY_SEPARATOR,
    TRANSACTION_ROLLBACK_TYPE,
    DispatchRequest,
    index_key_hash,
    java_string_hashes,
)
from .fsutil import fsync_directory
from .mapped_file import StoreLoadError

log = logging.getLogger(__name__)

INDEX_HEADER_SIZE = 40
HASH_SLOT_SIZE = 4
INDEX_SIZE = 20
INVALID_INDEX = 0
INT_MAX = 0x7FFFFFFF
INDEX_FILE_NAME_DIGITS = 17

# One index entry, exactly as RocketMQ lays it out (20 bytes, no padding).
INDEX_ENTRY_DTYPE = np.dtype([("h", ">i4"), ("p", ">i8"), ("t", ">i4"), ("prev", ">i4")])

_HEADER = struct.Struct(">qqqqii")
_ENTRY = struct.Struct(">iqii")
_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
_BEGIN_TIMESTAMP_POS = 0
_END_TIMESTAMP_POS = 8
_BEGIN_PHY_OFFSET_POS = 16
_END_PHY_OFFSET_POS = 24
_NAME_RE = re.compile(r"^\d{17}$")
_INT_MIN_ABS = 0x80000000
MAX_PUT_BATCH = 1 << 20  # entries one build_index call can add past indexCount before the header moves


def record_index_keys(req: DispatchRequest) -> list[str]:
    """The keys `build_index` writes for a record: its UNIQ_KEY (when present), then every KEYS token.

    (`build_index` inlines this in its hot loop; recovery and `verify` call it to check entries.)"""
    keys = [req.uniq_key] if req.uniq_key is not None else []
    if req.keys:
        keys += [k for k in req.keys.split(KEY_SEPARATOR) if k]
    return keys


def index_file_size(hash_slot_num: int, index_num: int) -> int:
    """`40 + hashSlotNum*4 + indexNum*20` (420,000,040 with RocketMQ's defaults)."""
    return INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE + index_num * INDEX_SIZE


def time_millis_to_human_string(millis: int) -> str:
    """`UtilAll.timeMillisToHumanString`: `yyyyMMddHHmmssSSS` in the local time zone (17 digits)."""
    dt = datetime.fromtimestamp(millis // 1000)
    return f"{dt.strftime('%Y%m%d%H%M%S')}{millis % 1000:03d}"


def _next_human_string(name: str) -> str:
    """The 17-digit name one millisecond after `name` (local wall-clock arithmetic)."""
    dt = datetime.strptime(name[:14], "%Y%m%d%H%M%S") + timedelta(milliseconds=int(name[14:]) + 1)
    return f"{dt.strftime('%Y%m%d%H%M%S')}{dt.microsecond // 1000:03d}"


def _wrap64(v: int) -> int:
    """Java long arithmetic: wrap to a signed 64-bit value."""
    return ((v + (1 << 63)) & 0xFFFFFFFFFFFFFFFF) - (1 << 63)


def index_key_hashes(keys: list[str]) -> np.ndarray:
    """`indexKeyHashMethod` of many keys at once: abs(hashCode), Integer.MIN_VALUE → 0 (int32 array)."""
    h = java_string_hashes(keys).astype(np.int64)
    np.abs(h, out=h)
    h[h == _INT_MIN_ABS] = 0
    return h.astype(np.int32)


# have_candidates' walk of an index file in C (THE END LANE), when the native core is active
_INDEX_HAVE = getattr(codec.native, "end_index_have", None) if codec.native is not None else None
_I64 = struct.Struct("=q")  # the native loop's offsets and times (native byte order, as numpy's int64)
_RAW_MAX = 16  # build_index passes of up to this many records skip the arrays (IndexFile.put_keys_raw)


def index_entries(requests: Sequence[DispatchRequest], end_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The index entries of a dispatched batch as `(hashes int32, phy offsets int64, store times int64)`:
    the native loop when it is active (`codec.NATIVE`), else `index_entries_py` (the reference; same arrays)."""
    if codec.native is not None:
        raw = codec.native.index_keys(requests, end_phy, TRANSACTION_ROLLBACK_TYPE)
        if raw is not None:
            return (np.frombuffer(raw[0], dtype=np.int32), np.frombuffer(raw[1], dtype=np.int64),
                    np.frombuffer(raw[2], dtype=np.int64))
    return index_entries_py(requests, end_phy)


def index_entries_py(requests: Sequence[DispatchRequest], end_phy: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`IndexService.buildIndex`'s keys for each record of a batch: skipped when its offset is below
    `end_phy` (already indexed) or when it is a ROLLBACK; otherwise `topic#uniqKey`, then `topic#token`
    for every non-empty KEYS token, hashed with `indexKeyHashMethod` in one vectorised call."""
    keys: list[str] = []
    offsets: list[int] = []
    timestamps: list[int] = []
    counts: list[int] = []
    add = keys.append
    # DispatchRequest fields unpacked positionally: this loop is the dispatcher's hot path
    for topic, _q, off, _size, _tags, store_ts, _cqo, msg_keys, uniq, sys_flag, _ptx, _props in requests:
        # transaction_value(sysFlag) == ROLLBACK, inlined
        if off < end_phy or (sys_flag & TRANSACTION_ROLLBACK_TYPE) == TRANSACTION_ROLLBACK_TYPE:
            continue
        m = 0
        if uniq is not None:
            add(f"{topic}#{uniq}")
            m = 1
        if msg_keys:
            if KEY_SEPARATOR in msg_keys:
                for tok in msg_keys.split(KEY_SEPARATOR):
                    if tok:
                        add(f"{topic}#{tok}")
                        m += 1
            else:
                add(f"{topic}#{msg_keys}")
                m += 1
        if m:
            offsets.append(off)
            timestamps.append(store_ts)
            counts.append(m)
            end_phy = off
    if not keys:
        return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    reps = np.asarray(counts, dtype=np.int64)
    return (index_key_hashes(keys), np.repeat(np.asarray(offsets, dtype=np.int64), reps),
            np.repeat(np.asarray(timestamps, dtype=np.int64), reps))


def build_key(topic: str, key: str) -> str:
    """`IndexService.buildKey`: the indexed string `topic#key`."""
    return f"{topic}#{key}"


class IndexReadOnlyError(RuntimeError):
    """A write to an index file or service opened read-only (it maps another process's files)."""


class IndexFile:
    """One RocketMQ index file: a header, a hash-slot table and chained 20-byte entries, memory-mapped.

    Writing mirrors `IndexFile.putKey` byte for byte; `put_keys` is the vectorised equivalent used by
    the dispatcher. A file opened `read_only` maps what exists and never writes.
    """

    # the header fields and the mapping, which `_native.dispatch_singles` reads and writes, are slots (read by
    # offset, not by attribute look-up); everything else lives in the instance dict as before
    __slots__ = ("read_only", "_index_count", "index_num", "hash_slot_num", "_entries_base", "_begin_timestamp",
                 "_end_timestamp", "_begin_phy_offset", "_end_phy_offset", "_hash_slot_count", "mm", "_dirty",
                 "__dict__", "__weakref__")

    def __init__(
        self, path: str, hash_slot_num: int, index_num: int, end_phy_offset: int = 0,
        end_timestamp: int = 0, read_only: bool = False,
    ) -> None:
        if hash_slot_num <= 0 or index_num <= 0:
            raise ValueError("hash_slot_num and index_num must be positive")
        self.path = path
        self.file_name = os.path.basename(path)
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.file_size = index_file_size(hash_slot_num, index_num)
        self.read_only = read_only
        self._entries_base = INDEX_HEADER_SIZE + hash_slot_num * HASH_SLOT_SIZE
        self._slots: np.ndarray | None = None
        self._entries: np.ndarray | None = None
        self._dirty = False
        self._begin_timestamp = 0
        self._end_timestamp = 0
        self._begin_phy_offset = 0
        self._end_phy_offset = 0
        self._hash_slot_count = 0
        self._index_count = 1
        self.mm: mmap.mmap | None
        if read_only:
            self._fd = os.open(path, os.O_RDONLY)
            self.mapped_size = min(os.fstat(self._fd).st_size, self.file_size)
            self.mm = mmap.mmap(self._fd, self.mapped_size, access=mmap.ACCESS_READ) if self.mapped_size else None
            self.load()
            return
        existed = os.path.exists(path) and os.path.getsize(path) > 0
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        actual = os.fstat(self._fd).st_size
        if actual != self.file_size and actual > 0:
            # Another geometry wrote this file: extending or reinterpreting it would corrupt the index.
            os.close(self._fd)
            raise StoreLoadError(
                f"{path} is {actual} bytes but an index file of {hash_slot_num} slots and {index_num} "
                f"entries is {self.file_size}; open the store with the max_hash_slot_num / max_index_num "
                "it was written with")
        if actual < self.file_size:
            os.ftruncate(self._fd, self.file_size)  # sparse, as mapping the full size does in Java
        self.mapped_size = self.file_size
        self.mm = mmap.mmap(self._fd, self.file_size, access=mmap.ACCESS_WRITE)
        self._slots = np.frombuffer(self.mm, dtype=">i4", count=hash_slot_num, offset=INDEX_HEADER_SIZE)
        self._entries = np.frombuffer(self.mm, dtype=INDEX_ENTRY_DTYPE, count=index_num,
                                      offset=self._entries_base)
        if existed:
            self.load()
            return
        # A new file starts where the previous one ended; only these four setters touch the disk.
        if end_phy_offset > 0:
            self._begin_phy_offset = self._end_phy_offset = end_phy_offset
            _LONG.pack_into(self.mm, _BEGIN_PHY_OFFSET_POS, end_phy_offset)
            _LONG.pack_into(self.mm, _END_PHY_OFFSET_POS, end_phy_offset)
        if end_timestamp > 0:
            self._begin_timestamp = self._end_timestamp = end_timestamp
            _LONG.pack_into(self.mm, _BEGIN_TIMESTAMP_POS, end_timestamp)
            _LONG.pack_into(self.mm, _END_TIMESTAMP_POS, end_timestamp)
        self._fsync_dir()

    def _fsync_dir(self) -> None:
        fsync_directory(os.path.dirname(self.path))

    # -- header --------------------------------------------------------------------------------
    def load(self) -> None:
        """`IndexHeader.load`: read the header from the file; an indexCount ≤ 0 counts as 1."""
        if self.mm is None or self.mapped_size < INDEX_HEADER_SIZE:
            bt = et = bp = ep = hsc = ic = 0
        else:
            bt, et, bp, ep, hsc, ic = _HEADER.unpack_from(self.mm, 0)
        self._begin_timestamp, self._end_timestamp = bt, et
        self._begin_phy_offset, self._end_phy_offset = bp, ep
        self._hash_slot_count = hsc
        self._index_count = ic if ic > 0 else 1

    def _write_header(self) -> None:
        # After a put every header field has been written by one of Java's setters, so writing all six
        # gives the same bytes.
        _HEADER.pack_into(self.mm, 0, self._begin_timestamp, self._end_timestamp, self._begin_phy_offset,
                          self._end_phy_offset, self._hash_slot_count, self._index_count)

    @property
    def begin_timestamp(self) -> int:
        return self._begin_timestamp

    @property
    def end_timestamp(self) -> int:
        return self._end_timestamp

    @property
    def begin_phy_offset(self) -> int:
        return self._begin_phy_offset

    @property
    def end_phy_offset(self) -> int:
        return self._end_phy_offset

    @property
    def hash_slot_count(self) -> int:
        return self._hash_slot_count

    @property
    def index_count(self) -> int:
        return self._index_count

    @property
    def entry_count(self) -> int:
        """Entries stored (indexCount - 1: entry 0 is the chain terminator)."""
        return max(self._index_count - 1, 0)

    def is_write_full(self) -> bool:
        return self._index_count >= self.index_num

    def is_time_matched(self, begin: int, end: int) -> bool:
        """`isTimeMatched`: `[begin, end]` encloses the file's time range or one of its ends falls inside it."""
        fb, fe = self._begin_timestamp, self._end_timestamp
        return (begin < fb and end > fe) or (fb <= begin <= fe) or (fb <= end <= fe)

    # -- writing -------------------------------------------------------------------------------
    def _check_writable(self) -> None:
        if self.read_only:
            raise IndexReadOnlyError(f"{self.path} is open read-only")
        if self.mm is None or self.mm.closed:
            raise ValueError(f"{self.path} is closed")

    def put_key(self, key: str, phy_offset: int, store_timestamp: int) -> bool:
        """`IndexFile.putKey`: add one entry for `key`; False when the file is full."""
        self._check_writable()
        if self._index_count >= self.index_num:
            return False
        return self._put_hash(index_key_hash(key), phy_offset, store_timestamp)

    def _put_hash(self, key_hash: int, phy_offset: int, store_timestamp: int) -> bool:
        mm = self.mm
        count = self._index_count
        abs_slot_pos = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        slot_value = _INT.unpack_from(mm, abs_slot_pos)[0]
        if slot_value <= INVALID_INDEX or slot_value > count:
            slot_value = INVALID_INDEX
        begin = self._begin_timestamp
        if begin <= 0:
            time_diff = 0
        else:
            diff = _wrap64(store_timestamp - begin)
            time_diff = 0 if diff < 0 else min(diff // 1000, INT_MAX)
        _ENTRY.pack_into(mm, self._entries_base + count * INDEX_SIZE, key_hash, phy_offset, time_diff,
                         slot_value)
        _INT.pack_into(mm, abs_slot_pos, count)
        if count <= 1:  # first entry: its timeDiff was computed against the inherited beginTimestamp
            self._begin_phy_offset = phy_offset
            self._begin_timestamp = store_timestamp
        if slot_value == INVALID_INDEX:
            self._hash_slot_count += 1
        self._index_count = count + 1
        self._end_phy_offset = phy_offset
        self._end_timestamp = store_timestamp
        self._write_header()
        self._dirty = True
        return True

    def put_keys(self, hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray) -> int:
        """Add entries for many key hashes (already `abs`'d, as `index_key_hashes` returns) in one go.

        Inserts as many as fit and returns how many; the file's bytes are exactly those that calling
        `put_key` once per key would leave. Entries are written with one slice assignment, the chains
        within the batch are linked by a stable sort on the slot.
        """
        self._check_writable()
        n = len(hashes)
        if len(phy_offsets) != n or len(store_timestamps) != n:
            raise ValueError("hashes, phy_offsets and store_timestamps must have the same length")
        count = self._index_count
        k = min(n, self.index_num - count)
        if k <= 0:
            return 0
        if codec.native is not None:  # _put_hash entry by entry, in C (the same bytes)
            k, used, begin_phy, begin_ts = codec.native.put_index_entries(
                self.mm, self._entries_base, self.hash_slot_num, self.index_num, count, self._begin_timestamp,
                np.ascontiguousarray(hashes[:k], dtype=np.int32), np.ascontiguousarray(phy_offsets[:k], dtype=np.int64),
                np.ascontiguousarray(store_timestamps[:k], dtype=np.int64))
            return self._after_put(count, k, used, begin_phy, begin_ts, int(phy_offsets[k - 1]),
                                     int(store_timestamps[k - 1]))
        return self._put_keys_np(hashes, phy_offsets, store_timestamps, count, k)

    def put_keys_raw(self, hashes: bytes, phy_offsets: bytes, store_timestamps: bytes) -> int:
        """`put_keys` of entries as the native key loop makes them (`_native.index_keys`: int32 hashes, int64
        offsets and store times, native byte order), without building arrays: what a dispatch pass of one
        or two records spends most of its index time on. Native core only; returns how many fit."""
        self._check_writable()
        count = self._index_count
        k, used, begin_phy, begin_ts = codec.native.put_index_entries(
            self.mm, self._entries_base, self.hash_slot_num, self.index_num, count, self._begin_timestamp,
            hashes, phy_offsets, store_timestamps)
        if k <= 0:  # the file is full, or no entries
            return 0
        return self._after_put(count, k, used, begin_phy, begin_ts, _I64.unpack_from(phy_offsets, 8 * (k - 1))[0],
                                 _I64.unpack_from(store_timestamps, 8 * (k - 1))[0])

    def _after_put(self, count: int, k: int, used: int, begin_phy: int | None, begin_ts: int, end_phy: int,
                     end_ts: int) -> int:
        """The header after `put_keys` wrote `k` entries from entry `count` on (`put_index_entries` or numpy),
        `used` of them into empty slots; `begin_phy`, `begin_ts`: the file's first entry when it was among
        them (`begin_phy` None otherwise); the last one at `end_phy`, stored at `end_ts`. Leaves the values
        `put_key` would (header fields and file) and returns `k`."""
        if begin_phy is not None:
            self._begin_phy_offset = begin_phy
            self._begin_timestamp = begin_ts
        self._hash_slot_count += used
        self._index_count = count + k
        self._end_phy_offset = end_phy
        self._end_timestamp = end_ts
        # _write_header, inlined: this runs once per dispatch pass
        _HEADER.pack_into(self.mm, 0, self._begin_timestamp, end_ts, self._begin_phy_offset, end_phy,
                          self._hash_slot_count, count + k)
        self._dirty = True
        return k

    def _put_keys_np(self, hashes: np.ndarray, phy_offsets: np.ndarray, store_timestamps: np.ndarray, count: int,
                     k: int) -> int:
        """`put_keys` in numpy (the reference of the native loop, itself tested against `put_key`)."""
        h = np.asarray(hashes[:k], dtype=np.int64)
        p = np.asarray(phy_offsets[:k], dtype=np.int64)
        ts = np.asarray(store_timestamps[:k], dtype=np.int64)
        idx = np.arange(count, count + k, dtype=np.int64)

        # timeDiff: the first entry of a file uses the inherited beginTimestamp, later ones its own time.
        first = count <= 1
        begin_after = int(ts[0]) if first else self._begin_timestamp
        begins = np.full(k, begin_after, dtype=np.int64)
        begins[0] = self._begin_timestamp
        with np.errstate(over="ignore"):
            diff = ts - begins  # wraps like Java long arithmetic
        time_diff = np.where((begins <= 0) | (diff < 0), 0, np.minimum(diff // 1000, INT_MAX))

        # prevIndex: link each entry to the previous entry of its slot within the batch, or (for the
        # first of a slot) to the slot table's value, which is invalid when ≤ 0 or > the entry's own index.
        slots = h % self.hash_slot_num
        order = np.argsort(slots, kind="stable")
        s_sorted = slots[order]
        i_sorted = idx[order]
        group_start = np.empty(k, dtype=bool)
        group_start[0] = True
        np.not_equal(s_sorted[1:], s_sorted[:-1], out=group_start[1:])
        prev_sorted = np.empty(k, dtype=np.int64)
        prev_sorted[1:] = i_sorted[:-1]
        starts = np.flatnonzero(group_start)
        table = self._slots
        current = table[s_sorted[starts]].astype(np.int64)
        empty = (current <= INVALID_INDEX) | (current > i_sorted[starts])
        current[empty] = INVALID_INDEX
        prev_sorted[starts] = current
        prev = np.empty(k, dtype=np.int64)
        prev[order] = prev_sorted

        rec = np.empty(k, dtype=INDEX_ENTRY_DTYPE)
        rec["h"] = h
        rec["p"] = p
        rec["t"] = time_diff
        rec["prev"] = prev
        self._entries[count:count + k] = rec
        group_end = np.empty(k, dtype=bool)
        group_end[-1] = True
        group_end[:-1] = group_start[1:]
        table[s_sorted[group_end]] = i_sorted[group_end]

        return self._after_put(count, k, int(np.count_nonzero(empty)), int(p[0]) if first else None, int(ts[0]),
                                 int(p[-1]), int(ts[-1]))

    # -- reading -------------------------------------------------------------------------------
    def select_phy_offsets(
        self, key: str, max_num: int, begin: int, end: int, phy_offsets: list[int] | None = None,
    ) -> list[int]:
        """`selectPhyOffset`: offsets of entries whose hash equals `key`'s and whose time is in `[begin, end]`.

        Results are appended to `phy_offsets` (a new list by default) until it holds `max_num`. Hash
        collisions are returned too: the caller checks the real key.
        """
        out = [] if phy_offsets is None else phy_offsets
        self.select_by_hash(index_key_hash(key), max_num, begin, end, out)
        return out

    def select_by_hash(self, key_hash: int, max_num: int, begin: int, end: int, out: list[int]) -> None:
        """The chain walk of `selectPhyOffset` for a key hash already computed (appends to `out`)."""
        mm = self.mm
        if mm is None:
            return
        count = self._index_count
        size = self.mapped_size
        abs_slot_pos = INDEX_HEADER_SIZE + (key_hash % self.hash_slot_num) * HASH_SLOT_SIZE
        try:
            if abs_slot_pos + HASH_SLOT_SIZE > size:
                return
            slot_value = _INT.unpack_from(mm, abs_slot_pos)[0]
            if slot_value <= INVALID_INDEX or slot_value > count or count <= 1:
                return
            base = self._entries_base
            begin_ts = self._begin_timestamp
            unpack = _ENTRY.unpack_from
            nxt = slot_value
            for _ in range(count):  # a damaged chain with a cycle cannot loop forever
                if len(out) >= max_num:
                    break
                pos = base + nxt * INDEX_SIZE
                if pos + INDEX_SIZE > size:
                    break
                h, phy, time_diff, prev = unpack(mm, pos)
                if time_diff < 0:
                    break
                time_read = begin_ts + time_diff * 1000
                if h == key_hash and begin <= time_read <= end:
                    out.append(phy)
                if prev <= INVALID_INDEX or prev > count or prev == nxt or time_read < begin:
                    break
                nxt = prev
        except (ValueError, struct.error) as e:  # closed under us by a concurrent destroy
            log.warning("select in %s stopped: %s", self.path, e)

    # -- recovery ------------------------------------------------------------------------------
    def last_entry(self) -> tuple[int, int, int, int] | None:
        """(keyHash, phyOffset, timeDiff, prevIndex) of the newest entry, or None when the file is empty."""
        if self.mm is None or self._index_count <= 1:
            return None
        pos = self._entries_base + (self._index_count - 1) * INDEX_SIZE
        if pos + INDEX_SIZE > self.mapped_size:
            return None
        return _ENTRY.unpack_from(self.mm, pos)

    def rebuild_chains(self) -> bool:
        """Recovery after an abnormal exit: recompute every slot head and prevIndex link from the entries.

        A process killed inside `put_keys` after the slot table was updated but before the header was
        can leave slots pointing at entries past indexCount; the next put would then link new entries to
        those numbers (a self-loop) or treat the slot as empty, cutting older entries off their chain.
        Entries past indexCount are zeroed. Returns True when anything changed."""
        self._check_writable()
        entries, slots = self._entries, self._slots
        if entries is None or slots is None:
            return False
        count = self._index_count
        # Only a put cut short leaves traces, and only in the slots and the next batch's entries: when
        # there are none the chains are left alone (relinking a full file costs a sort of its entries).
        tail = entries[count:count + MAX_PUT_BATCH]
        if not bool((slots >= count).any()) and not bool((tail["h"] != 0).any() or (tail["p"] != 0).any()):
            return False
        changed = False
        dirty_tail = np.flatnonzero((tail["h"] != 0) | (tail["p"] != 0) | (tail["prev"] != 0))
        if dirty_tail.size:
            entries[count:count + int(dirty_tail[-1]) + 1] = np.zeros(int(dirty_tail[-1]) + 1,
                                                                        dtype=INDEX_ENTRY_DTYPE)
            changed = True
        n = count - 1
        new_slots = np.zeros(self.hash_slot_num, dtype=np.int64)
        if n > 0:
            s = entries["h"][1:count].astype(np.int64) % self.hash_slot_num
            idx = np.arange(1, count, dtype=np.int64)
            order = np.argsort(s, kind="stable")
            s_sorted, i_sorted = s[order], idx[order]
            same = s_sorted[1:] == s_sorted[:-1]
            prev_sorted = np.zeros(n, dtype=np.int64)
            prev_sorted[1:][same] = i_sorted[:-1][same]
            prev = np.empty(n, dtype=np.int64)
            prev[order] = prev_sorted
            ends = np.ones(n, dtype=bool)
            ends[:-1] = ~same
            new_slots[s_sorted[ends]] = i_sorted[ends]
            if not np.array_equal(entries["prev"][1:count].astype(np.int64), prev):
                entries["prev"][1:count] = prev
                changed = True
        if not np.array_equal(slots.astype(np.int64), new_slots):
            slots[:] = new_slots
            changed = True
        if changed:
            self._hash_slot_count = int(np.count_nonzero(new_slots))
            self._write_header()
            self._dirty = True
        return changed

    def repair_header(self, prev_end_phy: int, prev_end_timestamp: int) -> bool:
        """Recovery: make endPhyOffset agree with the entries (a kill inside the header write can leave
        the new endPhyOffset beside the old indexCount, and dispatch skips records below endPhyOffset).
        An empty file gets the previous file's end values, as at its creation. True when changed."""
        self._check_writable()
        count = self._index_count
        if count > 1 and self._entries is not None:
            last = self._entries[count - 1]
            ep = int(last["p"])
            if ep == self._end_phy_offset:
                return False
            self._end_phy_offset = ep
            self._end_timestamp = self._begin_timestamp + int(last["t"]) * 1000
        else:
            if self._end_phy_offset == prev_end_phy and self._begin_phy_offset == prev_end_phy:
                return False
            self._begin_phy_offset = self._end_phy_offset = prev_end_phy
            self._begin_timestamp = self._end_timestamp = prev_end_timestamp
        self._write_header()
        self._dirty = True
        return True

    def count_entries_at(self, phy_offset: int) -> int:
        """Entries of this file pointing at `phy_offset` (recovery: is the newest record fully indexed?)."""
        if self._entries is None or self._index_count <= 1:
            return 0
        return int(np.count_nonzero(self._entries["p"][1:self._index_count] == phy_offset))

    def truncate_from(self, phy_offset: int) -> int:
        """Recovery: drop the entries pointing at `phy_offset` or beyond (a commitlog tail that was cut).

        Entries are appended in commitlog order, so the dropped ones are the newest: each is unlinked
        from the head of its slot's chain (newest first), zeroed, and the header moves back to the last
        kept entry. Returns how many entries were dropped."""
        self._check_writable()
        count = self._index_count
        if count <= 1 or self._entries is None or self._slots is None:
            return 0
        entries = self._entries
        phys = entries["p"][1:count]
        keep = int(np.searchsorted(phys, phy_offset, side="left")) + 1  # first dropped entry number
        if bool((phys[keep - 1:] < phy_offset).any()):  # not sorted (damage): find the first bad entry
            keep = int(np.argmax(phys >= phy_offset)) + 1
        if keep >= count:
            return 0
        slots = self._slots
        for i in range(count - 1, keep - 1, -1):
            h, _p, _t, prev = (int(v) for v in entries[i])
            s = h % self.hash_slot_num
            if int(slots[s]) == i:
                slots[s] = prev if 0 < prev < keep else INVALID_INDEX
                if slots[s] == INVALID_INDEX:
                    self._hash_slot_count = max(0, self._hash_slot_count - 1)
        entries[keep:count] = np.zeros(count - keep, dtype=INDEX_ENTRY_DTYPE)
        self._index_count = keep
        if keep > 1:
            last = entries[keep - 1]
            self._end_phy_offset = int(last["p"])
            self._end_timestamp = self._begin_timestamp + int(last["t"]) * 1000
        else:
            self._end_phy_offset = self._begin_phy_offset
            self._end_timestamp = self._begin_timestamp
        self._write_header()
        self._dirty = True
        return count - keep

    # -- lifecycle -----------------------------------------------------------------------------
    def flush(self) -> None:
        """Write the whole header, then force the mapping to disk (`IndexFile.flush`)."""
        if self.read_only or self.mm is None or self.mm.closed:
            return
        self._write_header()
        self.mm.flush()
        self._dirty = False

    @property
    def dirty(self) -> bool:
        """True when entries were added since the last `flush`."""
        return self._dirty

    def refresh_read_only(self) -> None:
        """Re-map a read-only file that has grown and re-read its header (another process writes it)."""
        if not self.read_only or self._fd < 0:
            return
        actual = min(os.fstat(self._fd).st_size, self.file_size)
        if actual > self.mapped_size:
            old = self.mm
            self.mm = mmap.mmap(self._fd, actual, access=mmap.ACCESS_READ)
            self.mapped_size = actual
            if old is not None:
                try:
                    old.close()
                except BufferError:
                    pass
        self.load()

    def close(self) -> None:
        """Unmap and close the file (no flush)."""
        self._slots = None
        self._entries = None
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a view is still exported; the mapping goes away with it
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def shutdown(self) -> None:
        """`IndexFile.shutdown`: flush, then unmap."""
        self.flush()
        self.close()

    def destroy(self) -> bool:
        """Close and delete the file."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return True

    def __repr__(self) -> str:
        return (f"IndexFile({self.file_name}, entries={self.entry_count}/{self.index_num - 1}, "
                f"phy=[{self._begin_phy_offset}, {self._end_phy_offset}], "
                f"time=[{self._begin_timestamp}, {self._end_timestamp}])")


class QueryOffsetResult(NamedTuple):
    """`QueryOffsetResult`: candidate commitlog offsets (hash matches) and the newest file's end values."""

    phy_offsets: list[int]
    index_last_update_timestamp: int
    index_last_update_phyoffset: int


class IndexService:
    """`IndexService`: the ordered list of index files in `<root>/index`, fed by dispatch and queried by key.

    The index holds key *hashes*: `query_offset` returns the offsets of every entry whose hash equals the
    key's, so two different keys with equal `String.hashCode` (e.g. `AaTopic#BB` and `BBTopic#Aa`, as
    `"Aa".hashCode() == "BB".hashCode()`) both come back. The store must read each message and keep
    only those whose topic and key really match (RocketMQ issue #3613).
    """

    __slots__ = ("read_only", "_files", "__dict__", "__weakref__")  # for `_native.dispatch_singles`, see IndexFile

    def __init__(
        self, store_path: str, hash_slot_num: int, index_num: int, max_msgs_num_batch: int = 64,
        read_only: bool = False, on_index_file_full: Callable[[int], None] | None = None,
        flush_in_background: bool = True, clock: Callable[[], int] | None = None,
    ) -> None:
        self.store_path = store_path
        self.hash_slot_num = hash_slot_num
        self.index_num = index_num
        self.max_msgs_num_batch = max_msgs_num_batch
        self.read_only = read_only
        self.on_index_file_full = on_index_file_full
        self.flush_in_background = flush_in_background
        self._clock = clock or (lambda: time.time_ns() // 1_000_000)
        self._files: list[IndexFile] = []
        self._lock = threading.RLock()
        self._flush_threads: list[threading.Thread] = []

    @property
    def files(self) -> list[IndexFile]:
        """The index files, oldest first (a copy of the list)."""
        with self._lock:
            return list(self._files)

    def _list_names(self) -> list[str]:
        try:
            names = os.listdir(self.store_path)
        except FileNotFoundError:
            return []
        out = []
        for name in sorted(names):
            if _NAME_RE.match(name) and os.path.isfile(os.path.join(self.store_path, name)):
                out.append(name)
            else:
                log.warning("ignoring %s in %s: not an index file name", name, self.store_path)
        return out

    def load(self, last_exit_ok: bool, index_msg_timestamp: int = 0) -> bool:
        """Open the existing files in name order; after an abnormal exit, delete every file whose
        endTimestamp is newer than the checkpoint's indexMsgTimestamp (`IndexService.load`)."""
        with self._lock:
            names = self._list_names()
            for i, name in enumerate(names):
                try:
                    f = IndexFile(os.path.join(self.store_path, name), self.hash_slot_num, self.index_num,
                                  read_only=self.read_only)
                except StoreLoadError:
                    if self.read_only or self._one_foreign_geometry(names):
                        raise  # every file has another size: written with another geometry
                    # A damaged file (cut short, RocketMQ #10108): it and the newer files are rebuilt by
                    # dispatch from where the files before it end.
                    for later in names[i:]:
                        log.warning("deleting damaged or newer index file %s: it will be rebuilt", later)
                        os.unlink(os.path.join(self.store_path, later))
                    break
                if not last_exit_ok and not self.read_only and f.end_timestamp > index_msg_timestamp:
                    log.info("deleting index file %s: endTimestamp %d > indexMsgTimestamp %d",
                             name, f.end_timestamp, index_msg_timestamp)
                    f.destroy()
                    continue
                self._files.append(f)
        return True

    def _one_foreign_geometry(self, names: list[str]) -> bool:
        sizes = {os.path.getsize(os.path.join(self.store_path, n)) for n in names}
        return len(sizes) == 1 and sizes != {index_file_size(self.hash_slot_num, self.index_num)}

    # -- writing -------------------------------------------------------------------------------
    def _new_file_name(self) -> str:
        name = time_millis_to_human_string(self._clock())
        last = self._files[-1].file_name if self._files else ""
        if name <= last:
            name = _next_human_string(last)
        while os.path.exists(os.path.join(self.store_path, name)):
            name = _next_human_string(name)
        return name

    def get_and_create_last_index_file(self) -> IndexFile:
        """The last file if it is not full, else a new file that starts at the previous file's end values.

        A full previous file is flushed (in the background unless configured otherwise), then
        `on_index_file_full(its endTimestamp)` lets the store record the checkpoint's indexMsgTimestamp.
        """
        if self.read_only:
            raise IndexReadOnlyError("the index service is open read-only")
        with self._lock:
            prev = self._files[-1] if self._files else None
            if prev is not None and not prev.is_write_full():
                return prev
            os.makedirs(self.store_path, exist_ok=True)
            name = self._new_file_name()
            end_phy = prev.end_phy_offset if prev is not None else 0
            end_ts = prev.end_timestamp if prev is not None else 0
            f = IndexFile(os.path.join(self.store_path, name), self.hash_slot_num, self.index_num,
                          end_phy, end_ts)
            self._files.append(f)
        if prev is not None:
            if self.flush_in_background:
                t = threading.Thread(target=self._flush_full_file, args=(prev,), daemon=True,
                                     name="FlushIndexFileThread")
                t.start()  # before it is listed: wait_for_flushes (cleanup's thread) may join it at once
                with self._lock:
                    self._flush_threads = [x for x in self._flush_threads if x.is_alive()]
                    self._flush_threads.append(t)
            else:
                self._flush_full_file(prev)
        return f

    def _flush_full_file(self, f: IndexFile) -> None:
        index_msg_timestamp = f.end_timestamp if f.is_write_full() else 0
        try:
            f.flush()
        except (ValueError, OSError) as e:
            log.error("flush of index file %s failed: %s", f.path, e)
            return
        if index_msg_timestamp > 0 and self.on_index_file_full is not None:
            self.on_index_file_full(index_msg_timestamp)

    def wait_for_flushes(self) -> None:
        """Wait for the background flushes of full files started so far."""
        with self._lock:
            threads, self._flush_threads = self._flush_threads, []
        for t in threads:
            t.join()

    def build_index(self, requests: Sequence[DispatchRequest]) -> int:
        """Index a batch of dispatched records (`IndexService.buildIndex` for each); returns entries added.

        Per record: skipped when its offset is below the last file's endPhyOffset (already indexed) or
        when it is a ROLLBACK; otherwise `topic#uniqKey`, then `topic#token` for every non-empty KEYS
        token. All keys of the batch are hashed in one vectorised call and inserted with `put_keys`,
        rolling to new files as they fill up.
        """
        if not requests:
            return 0
        f = self.get_and_create_last_index_file()
        end_phy = f.end_phy_offset
        if codec.native is not None and len(requests) <= _RAW_MAX:  # a short pass: no arrays
            raw = codec.native.index_keys(requests, end_phy, TRANSACTION_ROLLBACK_TYPE)
            if raw is not None:
                hb, pb, tb = raw
                done = f.put_keys_raw(hb, pb, tb)  # here, not in _insert: a pass that fits makes no more calls
                if done << 2 == len(hb):
                    return done
                return self._insert(f, hb, pb, tb, True, done)  # the file filled up mid-pass
        hashes, phy, ts = index_entries(requests, end_phy)
        if not len(hashes):
            return 0
        return self._insert(f, hashes, phy, ts)

    def build_index_columns(self, hashes: bytes, phy: bytes, ts: bytes) -> int:
        """`build_index` of entries a native batch put already made (`codec.DispatchColumns`: int32 key
        hashes, int64 offsets and store times, in log order); entries below the last file's endPhyOffset
        are skipped, as `build_index` skips their records."""
        if not hashes:
            return 0
        f = self.get_and_create_last_index_file()
        h = np.frombuffer(hashes, dtype=np.int32)
        p = np.frombuffer(phy, dtype=np.int64)
        t = np.frombuffer(ts, dtype=np.int64)
        end_phy = f.end_phy_offset
        if p[0] < end_phy:
            keep = p >= end_phy
            h, p, t = h[keep], p[keep], t[keep]
            if not len(h):
                return 0
        return self._insert(f, h, p, t)

    def _insert(self, f: IndexFile, hashes: np.ndarray | bytes, phy: np.ndarray | bytes, ts: np.ndarray | bytes,
                raw: bool = False, done: int = 0) -> int:
        """Insert the entries of a `build_index` pass into `f` and the files after it, rolling as they fill:
        arrays with `put_keys`, or (`raw`) the native key loop's bytes with `put_keys_raw`. `done` entries
        are already in `f` (put by the caller). Returns how many the pass has.

        Arrays are sliced in entries, the raw bytes in bytes (4 per hash, 8 per offset or time)."""
        if raw:
            put, hw, w = IndexFile.put_keys_raw, 4, 8
        else:
            put, hw, w = IndexFile.put_keys, 1, 1
        n = len(hashes) // hw
        if not done:
            done = put(f, hashes, phy, ts)
        while done < n:  # the file filled up: the rest goes to the next one
            f = self.get_and_create_last_index_file()
            done += put(f, hashes[hw * done:], phy[w * done:], ts[w * done:])
        return n

    # -- reading -------------------------------------------------------------------------------
    def query_offset(self, topic: str, key: str, max_num: int, begin: int, end: int,
                     batch_limit: int | None = None) -> QueryOffsetResult:
        """`IndexService.queryOffset`: candidate offsets of `topic#key` stored in `[begin, end]`, newest file first.

        At most `min(max_num, max_msgs_num_batch)` offsets (`batch_limit` replaces RocketMQ's per-query cap
        for callers inside the broker that must see every entry of a key, such as a stream's events). The
        walk stops after a file that begins before `begin`. Offsets are hash matches: they may belong to
        other keys (see the class docstring).
        """
        max_num = min(max_num, self.max_msgs_num_batch if batch_limit is None else batch_limit)
        out: list[int] = []
        last_ts = last_phy = 0
        key_hash = index_key_hash(build_key(topic, key))
        files = self.files
        for i in range(len(files) - 1, -1, -1):
            f = files[i]
            if i == len(files) - 1:
                last_ts = f.end_timestamp
                last_phy = f.end_phy_offset
            if f.is_time_matched(begin, end):
                f.select_by_hash(key_hash, max_num, begin, end, out)
            if f.begin_timestamp < begin:
                break
            if len(out) >= max_num:
                break
        return QueryOffsetResult(out, last_ts, last_phy)

    def have_candidates(self, topic_keys: list[tuple[str, str]]) -> list[bool]:
        """For each `(topic, key)`: whether any index file holds an entry with its key hash (a candidate
        `query_offset` would return, of any time). False means no message of that topic has that key; True
        only that one may (hash matches include other keys). One walk of the files for all keys, and no
        record read: what a look-up that usually finds nothing (an END's search for earlier ends) asks first.
        Each file's walk in C with the native core (`_native.end_index_have`); when it declines, this walk."""
        if _INDEX_HAVE is not None:
            keys = [f"{t}#{k}" for t, k in topic_keys]
            found = [False] * len(keys)
            left: int | None = len(keys)
            for f in reversed(self.files):
                mm = f.mm
                if mm is not None:
                    left = _INDEX_HAVE(mm, f.mapped_size, f.hash_slot_num, f._index_count, f._begin_timestamp,
                                       f._entries_base, keys, found)
                    if left is None:
                        break
                if not left:
                    break
            if left is not None:
                return found
        return self.have_candidates_py(topic_keys)

    def have_candidates_py(self, topic_keys: list[tuple[str, str]]) -> list[bool]:
        """`have_candidates` in Python (the reference)."""
        hashes = [index_key_hash(build_key(t, k)) for t, k in topic_keys]
        found = [False] * len(hashes)
        left = len(hashes)
        out: list[int] = []
        for f in reversed(self.files):
            for i, h in enumerate(hashes):
                if not found[i]:
                    f.select_by_hash(h, 1, 0, 2**62, out)
                    if out:
                        out.clear()
                        found[i] = True
                        left -= 1
            if not left:
                break
        return found

    def get_total_entries(self) -> int:
        """Entries stored across all files."""
        return sum(f.entry_count for f in self.files)

    # -- maintenance ---------------------------------------------------------------------------
    def delete_expired_file(self, min_offset: int) -> int:
        """Delete the oldest files whose endPhyOffset < `min_offset`, never the last one, stopping at the
        first file still needed (`IndexService.deleteExpiredFile`); returns how many were deleted."""
        if self.read_only:
            raise IndexReadOnlyError("the index service is open read-only")
        with self._lock:
            if not self._files or self._files[0].end_phy_offset >= min_offset:
                return 0
            expired = []
            for f in self._files[:-1]:
                if f.end_phy_offset < min_offset:
                    expired.append(f)
                else:
                    break
        if not expired:
            return 0
        self.wait_for_flushes()
        with self._lock:
            for f in expired:
                f.destroy()
                self._files.remove(f)
                log.info("deleted expired index file %s", f.file_name)
        return len(expired)

    def drop_files_from(self, position: int) -> int:
        """Recovery: delete the files from `position` (in the oldest-first list) on, to be rebuilt by
        dispatch; returns how many were deleted."""
        if self.read_only:
            raise IndexReadOnlyError("the index service is open read-only")
        self.wait_for_flushes()
        with self._lock:
            doomed = self._files[position:]
            self._files = self._files[:position]
        for f in doomed:
            f.destroy()
        return len(doomed)

    def flush(self) -> None:
        """Flush (header + force) every file written since its last flush."""
        self.wait_for_flushes()
        for f in self.files:
            if f.dirty:
                f.flush()

    def refresh_read_only(self) -> None:
        """Pick up files another process created or deleted, and re-read the headers of the others."""
        if not self.read_only:
            return
        names = self._list_names()
        with self._lock:
            known = {f.file_name: f for f in self._files}
            kept: list[IndexFile] = []
            for f in self._files:
                if os.path.exists(f.path):
                    kept.append(f)
                else:
                    f.close()
            for name in names:
                if name not in known:
                    try:
                        kept.append(IndexFile(os.path.join(self.store_path, name), self.hash_slot_num,
                                              self.index_num, read_only=True))
                    except FileNotFoundError:
                        continue
            kept.sort(key=lambda x: x.file_name)
            for f in kept:
                f.refresh_read_only()
            self._files = kept

    def shutdown(self) -> None:
        """Flush and unmap every file (`IndexService.shutdown`)."""
        self.wait_for_flushes()
        with self._lock:
            for f in self._files:
                if self.read_only:
                    f.close()
                else:
                    f.shutdown()
            self._files = []

    def destroy(self) -> None:
        """Delete every index file."""
        self.wait_for_flushes()
        with self._lock:
            for f in self._files:
                f.destroy()
            self._files = []
