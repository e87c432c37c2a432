"""Java's `String.hashCode` and what RocketMQ derives from it: the tags code of a consume-queue unit
(`tagsString2tagsCode`) and the index-file key hash (`indexKeyHashMethod`)."""

from __future__ import annotations

import sys

import numpy as np

from .native import native

# -- Java String.hashCode -----------------------------------------------------------------------------
_M32 = 0xFFFFFFFF
_POW_LEN = 512
_POW31 = [pow(31, k, 1 << 32) for k in range(_POW_LEN)]
_POW31_REV = _POW31[::-1]  # [31^511, ..., 31^0]
_POW31_NP = np.array(_POW31, dtype=np.uint64)
_UTF16_NATIVE = "utf-16-le" if sys.byteorder == "little" else "utf-16-be"
_java_hash = getattr(native, "java_hash", None) if native is not None else None


def _to_signed32(h: int) -> int:
    return h - 0x100000000 if h & 0x80000000 else h


def java_string_hash(s: str) -> int:
    """Java's `String.hashCode` (31-polynomial over UTF-16 code units, signed 32-bit); in C
    (`_native.java_hash`) when the native core is active, `java_string_hash_py` otherwise."""
    if _java_hash is not None:
        h = _java_hash(s)
        if h is not None:
            return h
    return java_string_hash_py(s)


def java_string_hash_py(s: str) -> int:
    """The reference `java_string_hash` (and the path of a str with a lone surrogate, which raises)."""
    if s.isascii():
        units: bytes | memoryview = s.encode("ascii")
    else:
        units = memoryview(s.encode(_UTF16_NATIVE)).cast("H")
    n = len(units)
    if n <= _POW_LEN:
        h = sum(map(int.__mul__, units, _POW31_REV[_POW_LEN - n:])) & _M32
    else:
        h = 0
        for c in units:
            h = (31 * h + c) & _M32
    return _to_signed32(h)


def java_string_hashes(strings: list[str]) -> np.ndarray:
    """Java `String.hashCode` of many strings at once (vectorised; int32 array).

    Each code unit contributes `c * 31^(distance to the string's end)`; sums wrap modulo 2^64, which
    keeps the low 32 bits exact.
    """
    n = len(strings)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    data = "".join(strings).encode(_UTF16_NATIVE)
    units = np.frombuffer(data, dtype=np.uint16)
    if len(units) != sum(map(len, strings)):  # non-BMP characters: lengths in UTF-16 units differ
        lengths = np.fromiter((len(s.encode(_UTF16_NATIVE)) // 2 for s in strings), dtype=np.int64, count=n)
    else:
        lengths = np.fromiter(map(len, strings), dtype=np.int64, count=n)
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(n, dtype=np.int32)
    ends = np.cumsum(lengths)
    exps = np.repeat(ends, lengths) - 1 - np.arange(total, dtype=np.int64)
    maxlen = int(lengths.max())
    pows = _POW31_NP if maxlen <= _POW_LEN else np.array(
        [pow(31, k, 1 << 32) for k in range(maxlen)], dtype=np.uint64)
    contrib = units.astype(np.uint64) * pows[exps]
    starts = ends - lengths
    nonempty = lengths > 0
    sums = np.zeros(n, dtype=np.uint64)
    if nonempty.all():
        sums = np.add.reduceat(contrib, starts)
    else:
        sums[nonempty] = np.add.reduceat(contrib, starts[nonempty])
    return (sums & np.uint64(_M32)).astype(np.uint32).view(np.int32)


_TAGS_CODE_CACHE: dict[str, int] = {}


def tags_string_to_tags_code(tags: str | None) -> int:
    """`MessageExtBrokerInner.tagsString2tagsCode`: 0 for no tags, else the tag string's hashCode."""
    if not tags:
        return 0
    code = _TAGS_CODE_CACHE.get(tags)
    if code is None:
        code = java_string_hash(tags)
        if len(_TAGS_CODE_CACHE) < 65536:
            _TAGS_CODE_CACHE[tags] = code
    return code


def index_key_hash(key: str) -> int:
    """`IndexFile.indexKeyHashMethod`: abs(hashCode), with Integer.MIN_VALUE mapped to 0."""
    h = java_string_hash(key)
    return 0 if h == -0x80000000 else abs(h)
