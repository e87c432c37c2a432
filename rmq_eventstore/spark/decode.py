"""Vectorised decoding of commitlog records into Arrow record batches (no pyspark import here).

The record layout is `codec`'s (spec §1); this module only gathers the same fields for many records at
once with numpy, so a Spark task pays a few array operations per batch instead of Python work per
record. The sequential part, hopping over TOTALSIZE to find where records start, is a tight loop over
`codec.read_size_magic`; everything after it (header fields, body, topic, properties, hosts, message
ids) is gathered with fancy indexing and turned into Arrow arrays with `pa.Array.from_buffers`.

Every record is validated as `codec.check_message_and_return_size` does (magic, sizes that stay inside
the record, the computed length equal to TOTALSIZE); the first record that fails ends the range, as
the engine's reader stops at damage. Values equal what `codec.decode_message` returns in a
`MessageExt`: properties parsed like `codec.string_to_properties` (the last duplicate wins), hosts in
Java's `ip:port` text, `msg_id` the offsetMsgId of the store host and PHYSICALOFFSET.

When the C extension `rmq_eventstore._spark_native` is built (and `RMQ_EVENTSTORE_PURE` is not set;
`NATIVE` says which), `walk` and `decode_batch` run in C: it validates the same way and fills the Arrow
buffers of every column, which are wrapped here without a copy. A batch it declines (an IPv6 host, text
that is not strict UTF-8, a property name given twice) runs the numpy code below, which stays the
definition; `tests/spark/test_spark_native.py` holds the two to identical batches.
"""

from __future__ import annotations

import os
import struct
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..common import codec

# -- schema ------------------------------------------------------------------------------------------
COLUMNS: tuple[tuple[str, str], ...] = (
    ("topic", "string"), ("queue_id", "int"), ("queue_offset", "bigint"), ("commit_log_offset", "bigint"),
    ("store_size", "int"), ("sys_flag", "int"), ("flag", "int"), ("born_timestamp", "timestamp"),
    ("born_host", "string"), ("store_timestamp", "timestamp"), ("store_host", "string"),
    ("reconsume_times", "int"), ("prepared_transaction_offset", "bigint"), ("tags", "string"),
    ("keys", "string"), ("uniq_key", "string"), ("properties", "map<string,string>"), ("body", "binary"),
    ("msg_id", "string"),
)
DDL = ", ".join(f"{n} {t}" for n, t in COLUMNS)
_TS = pa.timestamp("us", tz="UTC")
_ARROW_TYPES = {"string": pa.string(), "int": pa.int32(), "bigint": pa.int64(), "timestamp": _TS,
                "map<string,string>": pa.map_(pa.string(), pa.string()), "binary": pa.binary()}
# What Spark's `to_arrow_schema(schema, timezone="UTC")` gives for DDL: every field nullable.
ARROW_SCHEMA = pa.schema([pa.field(n, _ARROW_TYPES[t], nullable=True) for n, t in COLUMNS])

BATCH_ROWS = 32768
BATCH_BYTES = 32 << 20

_V1 = codec.MESSAGE_MAGIC_CODE
_V2 = codec.MESSAGE_MAGIC_CODE_V2
_BLANK = codec.BLANK_MAGIC_CODE
_MAGIC_BYTES = (struct.pack(">i", _V1), struct.pack(">i", _V2))
_SIZE_MAGIC = struct.Struct(">ii")
_PHYS = struct.Struct(">q")

_HEAD48 = np.dtype([("total", ">i4"), ("magic", ">i4"), ("crc", ">i4"), ("queue_id", ">i4"),
                    ("flag", ">i4"), ("queue_offset", ">i8"), ("phys", ">i8"), ("sys_flag", ">i4"),
                    ("born_ts", ">i8")])
_TAIL44 = np.dtype([("born_addr", "V4"), ("born_port", ">i4"), ("store_ts", ">i8"), ("store_addr", "V4"),
                    ("store_port", ">i4"), ("reconsume", ">i4"), ("prep_tx", ">i8"), ("body_len", ">i4")])
_HEAD88 = np.dtype(_HEAD48.descr + _TAIL44.descr)  # the whole header of an all-IPv4 record
assert _HEAD48.itemsize == 48 and _TAIL44.itemsize == 40 and _HEAD88.itemsize == 88


def _load_native() -> object | None:
    """`rmq_eventstore._spark_native` (the scan in C) unless `RMQ_EVENTSTORE_PURE` is set or it is not built."""
    if os.environ.get("RMQ_EVENTSTORE_PURE", "0") not in ("", "0"):
        return None
    try:
        from .. import _spark_native
    except ImportError:
        return None
    return _spark_native


_native = _load_native()
NATIVE: bool = _native is not None  # True: `walk` and `decode_batch` run in C (same results)
_HEX = np.frombuffer(b"".join(f"{i:02X}".encode() for i in range(256)), dtype=np.uint16)
_HASH_MUL = np.uint64(0x9E3779B97F4A7C15)


# -- walking ------------------------------------------------------------------------------------------
@dataclass
class WalkState:
    """Where a walk over one segment stopped and why: "end" (range done), "more" (batch full),
    "blank", "zero" or "damage"."""

    pos: int
    reason: str = "end"
    detail: str = ""


def walk(buf: memoryview | bytes, pos: int, stop: int, limit: int, max_rows: int, max_bytes: int,
         state: WalkState) -> np.ndarray:
    """Record starts from `pos` while a record starts before `stop` and fits before `limit`.

    Checks magic and that TOTALSIZE stays inside `limit`; full validation is `decode_batch`'s. Returns at
    most `max_rows` starts (or about `max_bytes` of records); `state.pos` is where to continue.
    """
    if _native is not None:
        raw, state.pos, state.reason, state.detail = _native.walk(buf, pos, stop, limit, max_rows, max_bytes)
        return np.frombuffer(raw, dtype=np.int64)
    return _walk_py(buf, pos, stop, limit, max_rows, max_bytes, state)


def _walk_py(buf: memoryview | bytes, pos: int, stop: int, limit: int, max_rows: int, max_bytes: int,
             state: WalkState) -> np.ndarray:
    """`walk` in Python (the reference for `_spark_native.walk`)."""
    out: list[int] = []
    state.reason, state.detail = "more", ""
    unpack = _SIZE_MAGIC.unpack_from
    budget = pos + max_bytes
    append = out.append
    while pos < stop and len(out) < max_rows and pos < budget:
        if limit - pos < 8:
            state.reason = "zero" if not bytes(buf[pos:limit]).strip(b"\x00") else "damage"
            state.detail = "" if state.reason == "zero" else "no room for a record header"
            break
        total, magic = unpack(buf, pos)
        if magic == _V1 or magic == _V2:
            if total <= 0 or pos + total > limit:
                state.reason, state.detail = "damage", f"total size {total} runs past the readable data"
                break
            append(pos)
            pos += total
            continue
        if magic == _BLANK:
            state.reason = "blank"
        elif total == 0 and magic == 0:
            state.reason = "zero"
        else:
            state.reason, state.detail = "damage", f"illegal magic code {magic & 0xFFFFFFFF:#010x}"
        break
    else:
        if pos >= stop:
            state.reason = "end"
    state.pos = pos
    return np.fromiter(out, dtype=np.int64, count=len(out))


def resync(buf: memoryview | bytes, mm: object, pos: int, limit: int, file_from: int,
           before: int | None = None) -> int | None:
    """The first record start at or after `pos` (and before `before` when given), found by its magic code
    and PHYSICALOFFSET (which a broker writes as the record's own log offset), confirmed by
    `codec.check_message_and_return_size`.

    Used to start a split of a large segment on a record boundary without walking from the file's
    start, and by verify to continue past a damaged record. None when no record follows (zeros, a
    BLANK, or the end of the data). A split passes its end as `before`: a start past it is the next
    split's, and a split in a segment's preallocated zeros then searches only its own bytes, not the
    zeros of every split after it.
    """
    find = mm.find  # mmap.find / bytes.find: a memchr-speed search
    p = pos
    window = 1 << 16
    # A candidate start c < before has its magic code in [c + 4, c + 8): search no further than that.
    end = limit if before is None else min(limit, before + 7)
    while p < end:
        # Search a window that doubles until a magic code turns up, so that a magic code the store never
        # uses (V2 in a V1 store) does not send every search to the end of the segment.
        hi = min(end, p + 4 + window)
        hits = [h for h in (find(m, p + 4, hi) for m in _MAGIC_BYTES) if h >= 0]
        if not hits:
            if hi >= end:
                return None
            window *= 2
            p = hi - 7  # a magic code may straddle the window's end
            continue
        cand = min(hits) - 4
        if before is not None and cand >= before:
            return None
        if cand >= pos and cand + 36 <= limit and _PHYS.unpack_from(buf, cand + codec.PHY_POS_POSITION)[0] \
                == file_from + cand:
            r = codec.check_message_and_return_size(buf, cand, limit=limit)
            if r.success and r.size > 0:
                return cand
        p = cand + 1
    return None


# -- gathering helpers ---------------------------------------------------------------------------------
def _gather(a: np.ndarray, pos: np.ndarray, width: int) -> np.ndarray:
    """(n, width) uint8: `width` bytes at each position."""
    return a[pos[:, None] + np.arange(width, dtype=np.int64)]


def _be(a: np.ndarray, pos: np.ndarray, dtype: str) -> np.ndarray:
    """A big-endian integer of `dtype` (">i4", ">i2", ...) at each position, as native int64."""
    w = np.dtype(dtype).itemsize
    return np.ascontiguousarray(_gather(a, pos, w)).view(dtype).ravel().astype(np.int64)


def _slices(a: np.ndarray, pos: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate the byte slices `a[pos:pos+len]`: (int32 offsets of n + 1, uint8 data)."""
    n = len(pos)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offsets[1:])
    total = int(offsets[-1])
    if total == 0:
        return offsets.astype(np.int32), np.zeros(0, dtype=np.uint8)
    nz = lens > 0
    s, ln = (pos, lens) if nz.all() else (pos[nz], lens[nz])
    lo = int(s.min())
    hi = int((s + ln).max())
    if hi - lo <= 6 * total + 4096:  # dense (a scan): mark the slices in the region and compress
        d = np.zeros(hi - lo + 1, dtype=np.int8)
        d[s - lo] += 1
        d[s + ln - lo] -= 1
        mask = np.cumsum(d[:-1], dtype=np.int8).view(np.bool_)
        data = a[lo:hi][mask]
    else:  # sparse (records picked through consume queues): one index per byte
        idx = np.repeat(s - (offsets[:-1][nz] if not nz.all() else offsets[:-1]), ln)
        idx += np.arange(total, dtype=np.int64)
        data = a[idx]
    return offsets.astype(np.int32), data


_BIN = pa.binary()


def _binary(offsets: np.ndarray, data: np.ndarray, typ: pa.DataType = _BIN) -> pa.Array:
    return pa.Array.from_buffers(typ, len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _text(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A string array; bytes that are not UTF-8 are decoded with replacement characters, as the engine does."""
    arr = _binary(offsets, data, pa.string())
    try:
        arr.validate(full=True)
        return arr
    except pa.ArrowInvalid:
        raw = data.tobytes()
        return pa.array([raw[offsets[i]:offsets[i + 1]].decode("utf-8", "replace")
                         for i in range(len(offsets) - 1)], type=pa.string())


def _ints(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    return pa.array(values.astype(typ.to_pandas_dtype(), copy=False), type=typ)


def _timestamps(ms: np.ndarray) -> pa.Array:
    us = np.ascontiguousarray(ms, dtype=np.int64) * 1000
    return pa.Array.from_buffers(_TS, len(us), [None, pa.py_buffer(us)])


def _hosts(addr_rows: np.ndarray, ports: np.ndarray) -> pa.Array:
    """Java `ip:port` text for rows of (address bytes, int port); few distinct hosts are formatted."""
    n = len(ports)
    if n == 0:
        return pa.array([], type=pa.string())
    alen = addr_rows.shape[1]
    key = np.empty((n, alen + 4), dtype=np.uint8)
    key[:, :alen] = addr_rows
    key[:, alen:] = np.ascontiguousarray(ports.astype(">i4")).view(np.uint8).reshape(n, 4)
    if (key == key[0]).all():
        text = codec.format_host(key[0, :alen].tobytes(), int(ports[0]))
        return pa.array([text], type=pa.string()).take(pa.array(np.zeros(n, dtype=np.int32)))
    rows = np.ascontiguousarray(key).view(np.dtype((np.void, alen + 4))).ravel()
    uniq, inverse = np.unique(rows, return_inverse=True)
    texts = []
    for u in uniq:
        b = bytes(u)
        texts.append(codec.format_host(b[:alen], struct.unpack(">i", b[alen:])[0]))
    return pa.array(texts, type=pa.string()).take(pa.array(inverse.astype(np.int32).ravel()))


def _hosts_mixed(a: np.ndarray, pos: np.ndarray, v6: np.ndarray) -> pa.Array:
    """Host text where rows differ in address length (4 or 16 bytes, then a 4-byte port)."""
    n = len(pos)
    idx = np.zeros(n, dtype=np.int64)
    parts: list[pa.Array] = []
    base = 0
    for is6, alen in ((False, 4), (True, 16)):
        sel = np.nonzero(v6 == is6)[0]
        if len(sel) == 0:
            continue
        p = pos[sel]
        parts.append(_hosts(_gather(a, p, alen), _be(a, p + alen, ">i4")))
        idx[sel] = base + np.arange(len(sel))
        base += len(sel)
    return pa.concat_arrays(parts).take(pa.array(idx))


# -- properties -----------------------------------------------------------------------------------------
def _properties(poff: np.ndarray, pdata: np.ndarray, props_text: pa.Array) -> tuple[pa.Array, ...]:
    """(properties map, tags, keys, uniq_key) from the concatenated properties strings of a batch.

    Segments split at 0x02 (and record ends); a segment is `name 0x01 value` with both parts non-empty
    (`codec.string_to_properties`). Records whose keys might repeat, or whose bytes are not UTF-8, are
    parsed by the engine's own `string_to_properties` (the last duplicate wins in the map).
    """
    n = len(poff) - 1
    total = int(poff[-1])
    utf8_ok = props_text.type == pa.string() and _is_valid(props_text)
    if total == 0:
        empty = pa.MapArray.from_arrays(pa.array(np.zeros(n + 1, np.int32)), pa.array([], pa.string()),
                                        pa.array([], pa.string()))
        nulls = pa.nulls(n, pa.string())
        return empty, nulls, nulls, nulls
    poff64 = poff.astype(np.int64)
    sep2 = np.flatnonzero(pdata == 2)
    sep1 = np.flatnonzero(pdata == 1)
    is_cut = np.zeros(total + 1, dtype=bool)
    is_cut[sep2 + 1] = True
    is_cut[poff64[:-1]] = True
    cuts = np.flatnonzero(is_cut[:total])
    rec = np.searchsorted(poff64, cuts, side="right") - 1
    j = np.searchsorted(sep2, cuts)
    nxt = np.where(j < len(sep2), sep2[np.minimum(j, max(len(sep2) - 1, 0))] if len(sep2) else total, total)
    ends = np.minimum(nxt, poff64[rec + 1])
    k = np.searchsorted(sep1, cuts)
    first1 = np.where(k < len(sep1), sep1[np.minimum(k, max(len(sep1) - 1, 0))] if len(sep1) else total,
                      total)
    valid = (first1 > cuts) & (first1 + 1 < ends)
    s, f, e, r = cuts[valid], first1[valid], ends[valid], rec[valid]
    klen = f - s
    koff, kdata = _slices(pdata, s, klen)
    voff, vdata = _slices(pdata, f + 1, e - f - 1)
    counts = np.bincount(r, minlength=n)
    dup = _duplicate_records(r, counts, koff, kdata)
    if not utf8_ok or dup.any():
        return _properties_slow(props_text, n)
    moff = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(counts, out=moff[1:])
    keys = _binary(koff, kdata, pa.string())
    values = _binary(voff, vdata, pa.string())
    pmap = pa.MapArray.from_arrays(pa.array(moff), keys, values)
    out = [pmap]
    for name in ("TAGS", "KEYS", "UNIQ_KEY"):
        hit = np.flatnonzero(pc.equal(keys, name).to_numpy(zero_copy_only=False))
        idx = np.full(n, -1, dtype=np.int64)
        idx[r[hit]] = hit
        out.append(values.take(pa.array(idx, mask=idx < 0)))
    return tuple(out)


def _is_valid(arr: pa.Array) -> bool:
    try:
        arr.validate(full=True)
        return True
    except pa.ArrowInvalid:
        return False


def _duplicate_records(r: np.ndarray, counts: np.ndarray, koff: np.ndarray, kdata: np.ndarray) -> np.ndarray:
    """Records (bool per pair) that may hold a key twice: compares key hashes within each record."""
    m = len(r)
    if m == 0:
        return np.zeros(0, dtype=bool)
    klen = np.diff(koff).astype(np.int64)
    within = np.arange(len(kdata), dtype=np.int64) - np.repeat(koff[:-1].astype(np.int64), klen)
    mult = (kdata.astype(np.uint64) + np.uint64(1)) * (_HASH_MUL ** (within.astype(np.uint64) + np.uint64(1)))
    h = np.add.reduceat(mult, koff[:-1].astype(np.int64)) ^ klen.astype(np.uint64)
    dup = np.zeros(m, dtype=bool)
    most = int(counts.max())
    if most <= 16:
        for lag in range(1, most):
            same = (r[lag:] == r[:-lag]) & (h[lag:] == h[:-lag])
            dup[lag:] |= same
    else:
        order = np.lexsort((h, r))
        same = (r[order][1:] == r[order][:-1]) & (h[order][1:] == h[order][:-1])
        dup[order[1:][same]] = True
    return dup


def _properties_slow(props_text: pa.Array, n: int) -> tuple[pa.Array, ...]:
    if props_text.type != pa.string():
        texts = [None if b is None else b.decode("utf-8", "replace") for b in props_text.to_pylist()]
    else:
        texts = props_text.to_pylist()
    maps = [codec.string_to_properties(t) for t in texts]
    pmap = pa.array([list(m.items()) for m in maps], type=pa.map_(pa.string(), pa.string()))
    return (pmap, pa.array([m.get("TAGS") for m in maps], pa.string()),
            pa.array([m.get("KEYS") for m in maps], pa.string()),
            pa.array([m.get("UNIQ_KEY") for m in maps], pa.string()))


# -- decoding ---------------------------------------------------------------------------------------
@dataclass
class Filters:
    """Row filters applied while decoding (exactly; Spark may drop the predicates it pushed here)."""

    topics: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    min_ts: int | None = None  # store timestamp, ms, inclusive
    max_ts: int | None = None  # inclusive
    min_offset: int | None = None  # commitlog offset of the record start, inclusive
    max_offset: int | None = None  # exclusive

    def active(self) -> bool:
        return any(v is not None for v in (self.topics, self.queue_ids, self.min_ts, self.max_ts,
                                           self.min_offset, self.max_offset))


@dataclass
class Decoded:
    """A batch (or None when every row was filtered out) and the index of the first invalid record."""

    batch: pa.RecordBatch | None
    bad: int | None = None  # index into `starts` of the first record that failed validation
    bad_reason: str = ""
    crc_bad: list[int] = field(default_factory=list)  # start positions whose BODYCRC does not match


def record_layout(a: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    """Header fields and the positions of body, topic and properties for every record (not yet validated)."""
    n = len(starts)
    # Gather 88 bytes when they are there (every record is longer: 88 is the smallest header), so the
    # common all-IPv4 batch needs one gather for the whole header.
    raw = None
    if len(starts) and int(starts.max()) + 88 <= len(a):
        raw = _gather(a, starts, 88)
        head = raw.view(_HEAD88).ravel()
    else:
        head = np.ascontiguousarray(_gather(a, starts, 48)).view(_HEAD48).ravel()
    sys_flag = head["sys_flag"].astype(np.int64)
    born6 = (sys_flag & codec.BORNHOST_V6_FLAG) != 0
    store6 = (sys_flag & codec.STOREHOSTADDRESS_V6_FLAG) != 0
    f: dict[str, np.ndarray] = {name: head[name].astype(np.int64) for name in _HEAD48.names}
    f["born6"], f["store6"] = born6, store6
    f["sys_flag"] = sys_flag
    total = f["total"]
    # The header up to BODYLEN must fit in TOTALSIZE before anything after byte 48 is read.
    hsize = 80 + np.where(born6, 16, 4) + np.where(store6, 16, 4)
    ok = (total >= hsize) & ((f["magic"] == _V1) | (f["magic"] == _V2))
    f["ok"] = ok
    safe = np.where(ok, starts, 0)  # rows that fail are read at 0 (inside the buffer) and dropped later
    if not born6.any() and not store6.any():
        if raw is not None:
            tail = head
            f["raw88"] = raw
        else:
            tail = np.ascontiguousarray(_gather(a, safe + 48, 40)).view(_TAIL44).ravel()
        f["store_ts"] = tail["store_ts"].astype(np.int64)
        f["reconsume"] = tail["reconsume"].astype(np.int64)
        f["born_port"] = tail["born_port"].astype(np.int64)
        f["store_port"] = tail["store_port"].astype(np.int64)
        f["prep_tx"] = tail["prep_tx"].astype(np.int64)
        f["body_len"] = tail["body_len"].astype(np.int64)
        f["born_host_pos"] = safe + 48
        f["store_host_pos"] = safe + 64
    else:
        bl = np.where(born6, 16, 4)
        sl = np.where(store6, 16, 4)
        p = safe + 48 + bl + 4
        f["born_host_pos"] = safe + 48
        f["store_ts"] = _be(a, p, ">i8")
        f["store_host_pos"] = p + 8
        p = p + 8 + sl + 4
        f["reconsume"] = _be(a, p, ">i4")
        f["prep_tx"] = _be(a, p + 4, ">i8")
        f["body_len"] = _be(a, p + 12, ">i4")
    body_pos = starts + hsize
    rec_end = starts + total
    body_len = f["body_len"]
    v2 = f["magic"] == _V2
    tl_width = np.where(v2, 2, 1)
    ok &= (body_len >= 0) & (body_pos + body_len + tl_width <= rec_end)
    tpos = np.where(ok, body_pos + body_len, 0)
    tl = np.where(v2, _be(a, tpos, ">i2") if v2.any() else 0, a[tpos].astype(np.int64))
    ok &= (tl >= 0) & (v2 | (tl <= 127))
    topic_pos = tpos + tl_width
    ppos = topic_pos + tl
    ok &= ppos + 2 <= rec_end
    pl = _be(a, np.where(ok, ppos, 0), ">i2")
    ok &= (pl >= 0) & (ppos + 2 + pl == rec_end)
    f["ok"] = ok
    f["body_pos"], f["topic_pos"], f["topic_len"] = body_pos, topic_pos, np.where(ok, tl, 0)
    f["props_pos"], f["props_len"] = ppos + 2, np.where(ok, pl, 0)
    f["n"] = np.array(n)
    return f


def first_invalid(ok: np.ndarray) -> int | None:
    """Index of the first record `record_layout` found invalid, None when all are valid."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else None


def decode_batch(a: np.ndarray, buf: memoryview | bytes, starts: np.ndarray, file_from: int,
                 filters: Filters | None = None, check_crc: bool = False, skip_bad: bool = False) -> Decoded:
    """Decode the records at `starts` (positions in the segment `a`, whose log offset is `file_from`).

    Records up to the first invalid one are decoded (`Decoded.bad` says where that was); with a
    `filters` only the matching rows are kept. With `skip_bad` invalid records are dropped instead. With `check_crc` the BODYCRC of every kept record is
    checked and mismatching start positions are listed in `crc_bad` (the rows are still returned).
    """
    if len(starts) == 0:
        return Decoded(None)
    if _native is not None:
        d = _decode_native(a, buf, starts, file_from, filters, check_crc, skip_bad)
        if d is not None:
            return d
    f = record_layout(a, starts)
    if skip_bad and not f["ok"].all():  # records picked through a consume queue: drop what is not one
        idx = np.flatnonzero(f["ok"])
        starts = starts[idx]
        f = {k: (v[idx] if v.ndim else v) for k, v in f.items()}
        if len(starts) == 0:
            return Decoded(None)
    bad = first_invalid(f["ok"])
    reason = ""
    if bad is not None:
        r = codec.check_message_and_return_size(buf, int(starts[bad]), limit=len(a))
        reason = r.reason or "record fails the length checks"
        starts = starts[:bad]
        f = {k: (v[:bad] if v.ndim else v) for k, v in f.items()}
        if len(starts) == 0:
            return Decoded(None, bad, reason)
    keep = None
    if filters is not None and filters.active():
        keep = np.ones(len(starts), dtype=bool)
        if filters.queue_ids is not None:
            keep &= np.isin(f["queue_id"], np.fromiter(filters.queue_ids, dtype=np.int64))
        if filters.min_ts is not None:
            keep &= f["store_ts"] >= filters.min_ts
        if filters.max_ts is not None:
            keep &= f["store_ts"] <= filters.max_ts
        if filters.min_offset is not None:
            keep &= starts + file_from >= filters.min_offset
        if filters.max_offset is not None:
            keep &= starts + file_from < filters.max_offset
    topic_off, topic_data = None, None
    if filters is not None and filters.topics is not None:
        sel = np.flatnonzero(keep) if keep is not None else np.arange(len(starts))
        topic_off, topic_data = _slices(a, f["topic_pos"][sel], f["topic_len"][sel])
        topics = _text(topic_off, topic_data)
        hit = pc.is_in(topics, value_set=pa.array(sorted(filters.topics), pa.string())).to_numpy(
            zero_copy_only=False)
        keep = np.zeros(len(starts), dtype=bool)
        keep[sel[hit]] = True
        topic_off = None  # recomputed below for the kept rows only
    if keep is not None and not keep.all():
        idx = np.flatnonzero(keep)
        if len(idx) == 0:
            return Decoded(None, bad, reason)
        starts = starts[idx]
        f = {k: (v[idx] if v.ndim else v) for k, v in f.items()}
    batch = _build(a, starts, f, file_from)
    crc_bad: list[int] = []
    if check_crc:
        crc_bad = check_body_crcs(buf, f["body_pos"], f["body_len"], f["crc"], starts)
    return Decoded(batch, bad, reason, crc_bad)


def _arrow_buffers(typ: pa.DataType, n: int, *bufs: bytes | None) -> pa.Array:
    return pa.Array.from_buffers(typ, n, [None if b is None else pa.py_buffer(b) for b in bufs])


_INT_TYPES = (pa.int32(), pa.int64(), pa.int64(), pa.int32(), pa.int32(), pa.int32(), _TS, _TS, pa.int32(),
              pa.int64())


def _decode_native(a: np.ndarray, buf: memoryview | bytes, starts: np.ndarray, file_from: int,
                   filters: Filters | None, check_crc: bool, skip_bad: bool) -> Decoded | None:
    """`decode_batch` through `_spark_native.decode`; None for a batch the C decoder leaves to numpy
    (IPv6 hosts, text that is not UTF-8, a property name given twice)."""
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    r = _native.decode(a, starts, check_crc, skip_bad)
    if r is None:
        return None
    n, bad, ints, topic, born, store, tags, keys, uniq, props, body, msg_id, crc_bad, kept = r
    reason = ""
    if bad >= 0:
        rr = codec.check_message_and_return_size(buf, int(starts[bad]), limit=len(a))
        reason = rr.reason or "record fails the length checks"
    bad_i = None if bad < 0 else bad
    if n == 0:
        return Decoded(None, bad_i, reason)
    starts = starts[np.frombuffer(kept, dtype=np.int64)]
    qid, qoff, phys, total, sys_flag, flag, born_ts, store_ts, reconsume, prep = (
        _arrow_buffers(t, n, None, b) for t, b in zip(_INT_TYPES, ints, strict=True))
    topic_a = _arrow_buffers(pa.string(), n, None, *topic)
    text = [_arrow_buffers(pa.string(), n, *t) for t in (tags, keys, uniq)]
    moff, koff, kdata, voff, vdata = props
    m = len(koff) // 4 - 1
    pmap = pa.MapArray.from_arrays(_arrow_buffers(pa.int32(), n + 1, None, moff),
                                   _arrow_buffers(pa.string(), m, None, koff, kdata),
                                   _arrow_buffers(pa.string(), m, None, voff, vdata))
    ids = _binary(np.arange(0, 32 * n + 1, 32, dtype=np.int32), np.frombuffer(msg_id, np.uint8), pa.string())
    cols = [topic_a, qid, qoff, phys, total, sys_flag, flag, born_ts, _arrow_buffers(pa.string(), n, None, *born),
            store_ts, _arrow_buffers(pa.string(), n, None, *store), reconsume, prep, *text, pmap,
            _arrow_buffers(pa.binary(), n, None, *body), ids]
    batch = pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)
    if filters is not None and filters.active():
        keep = np.ones(n, dtype=bool)
        if filters.queue_ids is not None:
            keep &= np.isin(np.frombuffer(ints[0], np.int32), np.fromiter(filters.queue_ids, dtype=np.int64))
        if filters.min_ts is not None or filters.max_ts is not None:
            ms = _be(a, starts + 56, ">i8")  # STORETIMESTAMP (all IPv4 here), as the numpy decoder compares it
            if filters.min_ts is not None:
                keep &= ms >= filters.min_ts
            if filters.max_ts is not None:
                keep &= ms <= filters.max_ts
        if filters.min_offset is not None:
            keep &= starts + file_from >= filters.min_offset
        if filters.max_offset is not None:
            keep &= starts + file_from < filters.max_offset
        if filters.topics is not None:
            keep &= pc.is_in(topic_a, value_set=pa.array(sorted(filters.topics), pa.string())).to_numpy(
                zero_copy_only=False)
        if not keep.all():
            if not keep.any():
                return Decoded(None, bad_i, reason)
            batch = batch.filter(pa.array(keep))
            if crc_bad:
                kept_starts = set(starts[keep].tolist())
                crc_bad = [s for s in crc_bad if s in kept_starts]
    return Decoded(batch, bad_i, reason, crc_bad)


def check_body_crcs(buf: memoryview | bytes, body_pos: np.ndarray, body_len: np.ndarray, crc: np.ndarray,
                    starts: np.ndarray) -> list[int]:
    """Start positions of records whose masked CRC-32 of the body differs from BODYCRC (empty bodies
    are not checked, as `checkMessageAndReturnSize` skips them)."""
    mv = memoryview(buf)
    crc32 = zlib.crc32
    bad = []
    for p, ln, c, s in zip(body_pos.tolist(), body_len.tolist(), crc.tolist(), starts.tolist(), strict=True):
        if ln and (crc32(mv[p:p + ln]) & 0x7FFFFFFF) != c:
            bad.append(s)
    return bad


def _build(a: np.ndarray, starts: np.ndarray, f: dict[str, np.ndarray], file_from: int) -> pa.RecordBatch:
    topic = _text(*_slices(a, f["topic_pos"], f["topic_len"]))
    poff, pdata = _slices(a, f["props_pos"], f["props_len"])
    ptext = _binary(poff, pdata, pa.string())
    if not _is_valid(ptext):
        ptext = _binary(poff, pdata)
    pmap, tags, keys, uniq = _properties(poff, pdata, ptext)
    body = _binary(*_slices(a, f["body_pos"], f["body_len"]))
    born6, store6 = f["born6"], f["store6"]
    raw = f.get("raw88")
    if raw is not None:  # all IPv4: everything is in the gathered header
        born = _hosts(raw[:, 48:52], f["born_port"])
        store = _hosts(raw[:, 64:68], f["store_port"])
        msg_id = _msg_ids_v4(raw)
    elif not born6.any():
        born = _hosts(_gather(a, f["born_host_pos"], 4), _be(a, f["born_host_pos"] + 4, ">i4"))
    else:
        born = _hosts_mixed(a, f["born_host_pos"], born6)
    if not store6.any():
        store = _hosts(_gather(a, f["store_host_pos"], 4), _be(a, f["store_host_pos"] + 4, ">i4"))
    else:
        store = _hosts_mixed(a, f["store_host_pos"], store6)
    if raw is None:
        msg_id = _msg_ids(a, f["store_host_pos"], store6, starts)
    cols = [
        topic, _ints(f["queue_id"], pa.int32()), _ints(f["queue_offset"], pa.int64()),
        _ints(f["phys"], pa.int64()), _ints(f["total"], pa.int32()), _ints(f["sys_flag"], pa.int32()),
        _ints(f["flag"], pa.int32()), _timestamps(f["born_ts"]), born, _timestamps(f["store_ts"]), store,
        _ints(f["reconsume"], pa.int32()), _ints(f["prep_tx"], pa.int64()), tags, keys, uniq, pmap, body,
        msg_id,
    ]
    return pa.RecordBatch.from_arrays(cols, schema=ARROW_SCHEMA)


def _msg_ids_v4(raw: np.ndarray) -> pa.Array:
    """offsetMsgIds of all-IPv4 records from their gathered headers (store host + port, PHYSICALOFFSET)."""
    n = len(raw)
    idb = np.empty((n, 16), dtype=np.uint8)
    idb[:, :8] = raw[:, 64:72]
    idb[:, 8:] = raw[:, 28:36]
    data = np.ascontiguousarray(_HEX[idb]).view(np.uint8).ravel()
    return _binary(np.arange(0, 32 * n + 1, 32, dtype=np.int32), data, pa.string())


def _msg_ids(a: np.ndarray, host_pos: np.ndarray, store6: np.ndarray, starts: np.ndarray) -> pa.Array:
    """offsetMsgId per record: hex of store address + port + PHYSICALOFFSET (`codec.create_message_id`)."""
    n = len(starts)
    width = np.where(store6, 28, 16)
    raw = np.zeros((n, 28), dtype=np.uint8)
    if not store6.any():
        raw[:, :8] = _gather(a, host_pos, 8)
        raw[:, 8:16] = _gather(a, starts + codec.PHY_POS_POSITION, 8)
    else:
        for is6, alen in ((False, 4), (True, 16)):
            sel = np.flatnonzero(store6 == is6)
            if len(sel):
                raw[sel, :alen + 4] = _gather(a, host_pos[sel], alen + 4)
                raw[sel, alen + 4:alen + 12] = _gather(a, starts[sel] + codec.PHY_POS_POSITION, 8)
    hexed = _HEX[raw].view(np.uint8).reshape(n, 56)
    mask = np.arange(56) < (2 * width)[:, None]
    data = hexed[mask]
    offsets = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(2 * width, out=offsets[1:])
    return _binary(offsets, np.ascontiguousarray(data), pa.string())


def iter_batches(buf: memoryview | bytes, a: np.ndarray, file_from: int, pos: int, stop: int,
                 filters: Filters | None = None, check_crc: bool = False, state: WalkState | None = None,
                 max_rows: int = BATCH_ROWS, max_bytes: int = BATCH_BYTES) -> Iterator[Decoded]:
    """Decode the records of one segment that start in [pos, stop), batch by batch, until the range
    ends or a BLANK, zeroed space or damage is met (`state.reason` tells which)."""
    st = state if state is not None else WalkState(pos)
    st.pos = pos
    limit = len(a)
    while True:
        starts = walk(buf, st.pos, stop, limit, max_rows, max_bytes, st)
        if len(starts):
            d = decode_batch(a, buf, starts, file_from, filters, check_crc)
            if d.bad is not None:
                st.pos = int(starts[d.bad])
                st.reason, st.detail = "damage", d.bad_reason
            yield d
            if d.bad is not None:
                return
        if st.reason != "more":
            return
