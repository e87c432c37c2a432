"""The commitlog record codec: the one module that knows RocketMQ's bytes (spec §1–§4).

Everything that reads or writes a record, a message id or a tags code calls this module; nothing else
packs or unpacks record fields. Layout of a record (big-endian, B/H = 8 or 20 for IPv4/IPv6 hosts,
T = 1 for V1 magic, 2 for V2):

    TOTALSIZE i | MAGIC i | BODYCRC i | QUEUEID i | FLAG i | QUEUEOFFSET q | PHYSICALOFFSET q |
    SYSFLAG i | BORNTIMESTAMP q | BORNHOST B | STORETIMESTAMP q | STOREHOST H | RECONSUMETIMES i |
    PREPAREDTXOFFSET q | BODYLEN i + body | TOPICLEN T + topic | PROPLEN h + properties

A file's unused tail is preceded by a BLANK record `[int remaining][int BLANK_MAGIC_CODE]`.
"""

from __future__ import annotations

import mmap
import struct
import time
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple, TypeAlias

from .delay import DEFAULT_DELAY_LEVELS_MS
from .message import Message, MessageExt
from .message_id import (  # noqa: F401  (re-exported: the codec is the one module callers use)
    MessageIdError,
    UniqueIdGenerator,
    _local_ip,
    _start_of_month_ms,
    create_message_id,
    decode_message_id,
    format_host,
    join_message_ids,
    parse_host,
)
from .native import NATIVE, native  # noqa: F401  (re-exported: codec.NATIVE says which loops run)
from .properties import (  # noqa: F401  (re-exported: the codec is the one module callers use)
    KEY_SEPARATOR,
    NAME_VALUE_SEPARATOR,
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_KEYS,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_SEPARATOR,
    PROPERTY_TAGS,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    PROPERTY_WAIT_STORE_MSG_OK,
    delete_property,
    java_hashmap_order,
    java_properties_string,
    properties_to_string,
    string_to_properties,
)
from .sysflag import (  # noqa: F401  (re-exported: the codec is the one module callers use)
    BLANK_MAGIC_CODE,
    BORNHOST_V6_FLAG,
    COMPRESSED_FLAG,
    COMPRESSION_LZ4_TYPE,
    COMPRESSION_TYPE_COMPARATOR,
    COMPRESSION_ZLIB_TYPE,
    COMPRESSION_ZSTD_TYPE,
    INNER_BATCH_FLAG,
    MESSAGE_MAGIC_CODE,
    MESSAGE_MAGIC_CODE_V2,
    MULTI_TAGS_FLAG,
    NEED_UNWRAP_FLAG,
    STOREHOSTADDRESS_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_PREPARED_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
    transaction_value,
)
from .tags import (  # noqa: F401  (re-exported: the codec is the one module callers use)
    _M32,
    _TAGS_CODE_CACHE,
    _to_signed32,
    index_key_hash,
    java_string_hash,
    java_string_hashes,
    tags_string_to_tags_code,
)

Buffer: TypeAlias = bytes | bytearray | memoryview  # anything records are read from (mmap views included)


# The native core (issue 16): which loops run (see common/native.py). The Python functions stay the
# definition: each native call falls back to them when it returns None.
if native is not None:
    native.init(Message)
# The pull read's functions (read_runs, decode_records; an extension built before them has neither).
pull_native = native if native is not None and hasattr(native, "init_pull") else None
# the batch send's loops (encode/decode of a SEND_BATCH_MESSAGE body): the C one sets every Message slot,
# so it is used only while the dataclass has exactly the fields it knows
batch_native = (native if native is not None and hasattr(native, "decode_batch_messages")
                and getattr(native, "MESSAGE_FIELD_COUNT", -1) == len(Message.__slots__) else None)
if pull_native is not None:
    pull_native.init_pull(MessageExt)

# -- constants (C/message/MessageDecoder.java, S/CommitLog.java) ------------------------------------
END_FILE_MIN_BLANK_LENGTH = 8
QUEUE_OFFSET_POSITION = 20
PHY_POS_POSITION = 28
SYSFLAG_POSITION = 36
BORN_TIMESTAMP_POSITION = 40
MAX_PROPERTIES_LENGTH = 32767  # Short.MAX_VALUE
MAX_TOPIC_LENGTH_V1 = 127
RECORD_HEADROOM = 64 * 1024  # MessageExtEncoder's buffer: max body + 64 KiB


PROPERTY_CRC32 = "__CRC32#"
CRC32_RESERVED_LEN = len(PROPERTY_CRC32) + 1 + 10 + 1  # 20
PROP_CRC_MISSING = "__CRC32# property missing"  # check_message_and_return_size's reason (verify_prop_crc)


def _java_length(s: str) -> int:
    """Java's `String.length()`: UTF-16 code units."""
    return len(s) if s.isascii() else len(s.encode("utf-16-le", "surrogatepass")) // 2


# -- precompiled structs ----------------------------------------------------------------------------
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_LONG = struct.Struct(">q")
_SIZE_MAGIC = struct.Struct(">ii")
_QOFF_PHYS = struct.Struct(">qq")
_BLANK = struct.Struct(">ii")


def _header_struct(born_len: int, store_len: int) -> struct.Struct:
    # total, magic, crc, queueId, flag, queueOffset, phys, sysFlag, bornTs, bornAddr, bornPort,
    # storeTs, storeAddr, storePort, reconsume, preparedTx, bodyLen
    return struct.Struct(f">iiiiiqqiq{born_len}siq{store_len}siiqi")


# Indexed by (born is v6) * 2 + (store is v6).
_HEADERS = tuple(_header_struct(b, s) for b in (4, 16) for s in (4, 16))
_HEADER_SIZES = tuple(h.size for h in _HEADERS)  # 88 / 100 / 100 / 112 (up to and incl. BODYLEN)


def _header_index(sys_flag: int) -> int:
    return (2 if sys_flag & BORNHOST_V6_FLAG else 0) + (1 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 0)


def store_timestamp_position(sys_flag: int) -> int:
    """Position of STORETIMESTAMP in a record (`CommitLog.pickupStoreTimestamp`)."""
    return 48 + (20 if sys_flag & BORNHOST_V6_FLAG else 8)


def cal_msg_length(
    body_length: int, topic_length: int, properties_length: int, sys_flag: int = 0, v2: bool = False
) -> int:
    """`MessageExtEncoder.calMsgLength`: 74 + B + H + T + body + topic + properties."""
    b = 20 if sys_flag & BORNHOST_V6_FLAG else 8
    h = 20 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 8
    return 74 + b + h + (2 if v2 else 1) + body_length + topic_length + properties_length


# -- CRC -------------------------------------------------------------------------------------------
def body_crc(body: bytes | bytearray | memoryview) -> int:
    """`UtilAll.crc32`: zlib CRC-32 masked to 31 bits (0 for an empty body)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def crc32_property_value(crc: int) -> str:
    """The 10 decimal digits of the `__CRC32#` trailer, least-significant first (spec §1.10)."""
    return str(crc)[::-1].ljust(10, "0")


def parse_crc32_property_value(value: str) -> int:
    """Inverse of `crc32_property_value`."""
    return int(value[::-1])


SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"  # TopicValidator.RMQ_SYS_SCHEDULE_TOPIC
_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def java_parse_int(s: str) -> int:
    """Java's `Integer.parseInt`: an optional sign and ASCII digits within int32; ValueError otherwise."""
    digits = s[1:] if s[:1] in ("+", "-") else s
    if not digits or not digits.isascii() or not digits.isdigit():
        raise ValueError(f"not an int: {s!r}")
    v = int(s)
    if not _INT32_MIN <= v <= _INT32_MAX:
        raise ValueError(f"int out of range: {s!r}")
    return v


def compute_deliver_timestamp(delay: str, store_timestamp: int, delay_levels: Sequence[int]) -> int | None:
    """The consume-queue tagsCode of a `SCHEDULE_TOPIC_XXXX` record with DELAY property `delay`: its
    delivery time, store time + the delay of the level clamped to the last one (`checkMessageAndReturnSize`
    + `computeDeliverTimestamp`, spec §14). None for a level <= 0 (the tag hash stays). ValueError when
    `delay` is not an int, as Java's `Integer.parseInt` throws."""
    level = java_parse_int(delay)
    if level > len(delay_levels):
        level = len(delay_levels)
    if level <= 0:
        return None
    return store_timestamp + delay_levels[level - 1]


def build_properties_string(msg: Message, uniq_key: str | None = None) -> str:
    """The properties string a producer would send for `msg` (TAGS, KEYS, UNIQ_KEY, then the rest)."""
    if msg.properties_string is not None:
        return msg.properties_string
    parts = []
    if msg.tags:
        parts.append(f"TAGS\x01{msg.tags}\x02")
    keys = msg.keys
    if keys:
        k = keys if isinstance(keys, str) else " ".join(keys)
        if k:
            parts.append(f"KEYS\x01{k}\x02")
    if uniq_key:
        parts.append(f"UNIQ_KEY\x01{uniq_key}\x02")
    if msg.properties:
        for k, v in msg.properties.items():
            if v is not None and k not in ("TAGS", "KEYS", "UNIQ_KEY"):
                parts.append(f"{k}\x01{v}\x02")
    return "".join(parts)


# -- encoding --------------------------------------------------------------------------------------
class EncodeError(ValueError):
    """A message that cannot be encoded; `status` names RocketMQ's put status for it."""

    def __init__(self, status: str, message: str) -> None:
        super().__init__(message)
        self.status = status  # "MESSAGE_ILLEGAL" or "PROPERTIES_SIZE_EXCEEDED"


class PreparedRecord(NamedTuple):
    """A record encoded before the put lock, waiting for its queue offset, physical offset and store time.

    The bytes are `head` + [queue offset, physical offset] + `mid` + [store timestamp] + `tail`: under the
    lock only the two bracketed parts are packed (`RecordEncoder.emit`). With the `__CRC32#` trailer the
    record is instead fully encoded in `buf` and patched.
    """

    total: int
    head: bytes  # TOTALSIZE, MAGIC, BODYCRC, QUEUEID, FLAG
    mid: bytes  # SYSFLAG, BORNTIMESTAMP, BORNHOST
    tail: bytes  # STOREHOST .. BODYLEN, body, topic, properties
    topic: str
    queue_id: int
    sys_flag: int
    tags_code: int
    keys: str | None
    uniq_key: str | None
    properties_string: str
    prepared_transaction_offset: int
    buf: bytearray | None


_PREPARED_NEW = tuple.__new__
_HEAD = struct.Struct(">iiiii")
_MID4 = struct.Struct(">iq4si")
_MID16 = struct.Struct(">iq16si")
_TAIL4 = struct.Struct(">4siiqi")
_TAIL16 = struct.Struct(">16siiqi")


def encode_record(
    *,
    topic: str,
    body: bytes,
    properties_string: str = "",
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    physical_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    born_host: tuple[bytes, int],
    store_timestamp: int = 0,
    store_host: tuple[bytes, int],
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
    force_v2: bool = False,
    auto_v2: bool = True,
    append_crc: bool = False,
    max_message_size: int = 4 * 1024 * 1024,
) -> bytearray:
    """Encode one complete commitlog record exactly as RocketMQ's `MessageExtEncoder` + `doAppend` do.

    The V6 host bits of `sys_flag` are set from the address lengths (as the broker sets them from the
    socket's family); V2 magic is used when forced or, with `auto_v2`, when the topic exceeds 127 chars.
    With `append_crc` the 5.2+ `__CRC32#` trailer is added to the properties and filled in.
    Raises `EncodeError` for the size rules of spec §1.6.
    """
    born_addr, born_port = born_host
    store_addr, store_port = store_host
    sys_flag &= ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
    if len(born_addr) == 16:
        sys_flag |= BORNHOST_V6_FLAG
    if len(store_addr) == 16:
        sys_flag |= STOREHOSTADDRESS_V6_FLAG
    # Java compares topic.length(), i.e. UTF-16 code units (a non-BMP character counts twice).
    v2 = force_v2 or (auto_v2 and _java_length(topic) > MAX_TOPIC_LENGTH_V1)
    if body is None:
        raise EncodeError("MESSAGE_ILLEGAL", "message body is null")
    # Checks in MessageExtEncoder.encode's order: properties size first, then body and record size.
    if append_crc:
        if PROPERTY_CRC32 in properties_string:
            properties_string = delete_property(properties_string, PROPERTY_CRC32)
        if properties_string and not properties_string.endswith("\x02"):
            properties_string += "\x02"
    props_bytes = properties_string.encode("utf-8")
    props_len = len(props_bytes) + (CRC32_RESERVED_LEN if append_crc else 0)
    if props_len > MAX_PROPERTIES_LENGTH:
        raise EncodeError(
            "PROPERTIES_SIZE_EXCEEDED", f"properties are {props_len} bytes, more than {MAX_PROPERTIES_LENGTH}")
    if len(body) > max_message_size:
        raise EncodeError(
            "MESSAGE_ILLEGAL", f"message body is {len(body)} bytes, more than max_message_size {max_message_size}")
    topic_bytes = topic.encode("utf-8")
    if not v2 and len(topic_bytes) > MAX_TOPIC_LENGTH_V1:
        raise EncodeError("MESSAGE_ILLEGAL", f"topic is {len(topic_bytes)} bytes, V1 records hold at most 127")
    if len(topic_bytes) > 32767:
        raise EncodeError("MESSAGE_ILLEGAL", "topic longer than 32767 bytes")
    header = _HEADERS[_header_index(sys_flag)]
    total = header.size + len(body) + (2 if v2 else 1) + len(topic_bytes) + 2 + props_len
    if total > max_message_size + RECORD_HEADROOM:
        raise EncodeError("MESSAGE_ILLEGAL", f"record of {total} bytes exceeds the maximum record size")
    buf = bytearray(total)
    header.pack_into(
        buf, 0, total, MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE, body_crc(body), queue_id,
        flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_addr, born_port,
        store_timestamp, store_addr, store_port, reconsume_times, prepared_transaction_offset, len(body),
    )
    pos = header.size
    mv = memoryview(buf)
    mv[pos:pos + len(body)] = body
    pos += len(body)
    if v2:
        _SHORT.pack_into(buf, pos, len(topic_bytes))
        pos += 2
    else:
        buf[pos] = len(topic_bytes)
        pos += 1
    mv[pos:pos + len(topic_bytes)] = topic_bytes
    pos += len(topic_bytes)
    _SHORT.pack_into(buf, pos, props_len)
    pos += 2
    mv[pos:pos + len(props_bytes)] = props_bytes
    if append_crc:
        fill_crc_trailer(buf)
    return buf


def encode_client_message(
    *,
    topic: str,
    body: bytes,
    born_host: tuple[bytes, int],
    store_host: tuple[bytes, int],
    tags: str | None = None,
    keys: str | Sequence[str] | None = None,
    properties: dict[str, str] | None = None,
    queue_id: int = 0,
    flag: int = 0,
    queue_offset: int = 0,
    commit_log_offset: int = 0,
    sys_flag: int = 0,
    born_timestamp: int = 0,
    store_timestamp: int = 0,
    reconsume_times: int = 0,
    prepared_transaction_offset: int = 0,
) -> bytearray:
    """The client library's `MessageDecoder.encode(MessageExt, false)`: the commitlog layout, always V1
    magic with a 1-byte topic length, no size limits of the broker and no CRC trailer.

    The properties are those of a Java `MessageExt` whose map received TAGS (if `tags`), KEYS (if `keys`;
    a sequence is joined with spaces) and then `properties`, in that order; they are written in Java
    `HashMap` iteration order (`java_hashmap_order`). The body CRC is computed from `body`; queue and
    commit-log offsets are whatever the `MessageExt` carries (0 unless given). A topic over 127 UTF-8
    bytes raises `EncodeError` (Java would write a truncated length byte that no reader can decode).
    """
    props: dict[str, str] = {}
    if tags:
        props[PROPERTY_TAGS] = tags
    if keys:
        k = keys if isinstance(keys, str) else KEY_SEPARATOR.join(keys)
        if k:
            props[PROPERTY_KEYS] = k
    if properties:
        props.update(properties)
    return encode_record(
        topic=topic, body=body, properties_string=java_properties_string(props), queue_id=queue_id,
        flag=flag, queue_offset=queue_offset, physical_offset=commit_log_offset, sys_flag=sys_flag,
        born_timestamp=born_timestamp, born_host=born_host, store_timestamp=store_timestamp,
        store_host=store_host, reconsume_times=reconsume_times,
        prepared_transaction_offset=prepared_transaction_offset, force_v2=False, auto_v2=False,
        max_message_size=max(len(body), 1 << 31),
    )


def crc_trailer(crc: int) -> bytes:
    """The 20 bytes `MessageDecoder.createCrc32` writes at the end of the properties: `__CRC32#`, 0x01, the
    10 digits of `crc` least-significant first, 0x02."""
    return (PROPERTY_CRC32 + "\x01" + crc32_property_value(crc) + "\x02").encode("ascii")


def fill_crc_trailer(buf: bytearray | memoryview, start: int = 0) -> None:
    """Write the `__CRC32#` trailer of the record at `start` (its last 20 bytes) from the bytes before it."""
    total = _INT.unpack_from(buf, start)[0]
    end = start + total - CRC32_RESERVED_LEN
    crc = zlib.crc32(memoryview(buf)[start:end]) & 0x7FFFFFFF
    memoryview(buf)[end:end + CRC32_RESERVED_LEN] = crc_trailer(crc)


class PlainBatch(NamedTuple):
    """What `RecordEncoder.encode_plain_batch` produced for one append."""

    data: bytes
    requests: list  # DispatchRequest per record, in log order
    offsets: list[int]  # physical offset of each record
    uniq_keys: list[str | None]
    queue_offsets: dict[str, int]  # "topic-queueId" -> next queue offset after this batch
    first_queue_offset: int


class RecordEncoder:
    """Encodes `Message`s for one store: the store host, size limits and CRC trailer bound once.

    `prepare` runs outside the put lock (CRC, properties, size rules); `emit` runs inside it and packs
    the header with the queue offset, physical offset and store time, as RocketMQ's encoder and
    `doAppend` split the work. Topics are validated by the caller; their encoded form is cached here.
    """

    def __init__(
        self, store_host: str = "127.0.0.1:10911", max_message_size: int = 4 * 1024 * 1024,
        auto_v2: bool = True, append_crc: bool = False, uniq_ids: UniqueIdGenerator | None = None,
        delay_levels: Sequence[int] = DEFAULT_DELAY_LEVELS_MS,
    ) -> None:
        self.store_host = parse_host(store_host)
        self.delay_levels = tuple(delay_levels)  # ms per delay level (messageDelayLevel), level 1 first
        self.max_message_size = max_message_size
        self.auto_v2 = auto_v2
        self.append_crc = append_crc
        self.uniq_ids = uniq_ids
        self._store_v6 = STOREHOSTADDRESS_V6_FLAG if len(self.store_host[0]) == 16 else 0
        self._topics: dict[str, tuple[bytes, int]] = {}  # topic -> (length-prefixed bytes, magic)
        self._plain_ctx: tuple | None = None  # encode_plain_one's bound arguments (built at its first call)
        self._net_ctx: tuple | None = None  # _native.append_one_net's bound arguments (network_context)

    def _topic_part(self, topic: str, force_v2: bool) -> tuple[bytes, int]:
        tp = None if force_v2 else self._topics.get(topic)
        if tp is None:
            tb = topic.encode("utf-8")
            v2 = force_v2 or (self.auto_v2 and _java_length(topic) > MAX_TOPIC_LENGTH_V1)
            if not v2 and len(tb) > MAX_TOPIC_LENGTH_V1:
                raise EncodeError("MESSAGE_ILLEGAL", f"topic is {len(tb)} bytes, V1 records hold at most 127")
            if len(tb) > 32767:
                raise EncodeError("MESSAGE_ILLEGAL", "topic longer than 32767 bytes")
            tp = ((_SHORT.pack(len(tb)) if v2 else bytes((len(tb),))) + tb,
                  MESSAGE_MAGIC_CODE_V2 if v2 else MESSAGE_MAGIC_CODE)
            if not force_v2 and len(self._topics) < 100_000:
                self._topics[topic] = tp
        return tp

    def prepare(self, msg: Message, uniq_key: str | None = None, born_timestamp: int = 0) -> PreparedRecord:
        """Encode `msg` up to the fields only the put lock knows.

        `uniq_key` is used when the message has none of its own; `born_timestamp` when the message's is 0
        (the producer did not set one). Raises `EncodeError` for the size rules of spec §1.6.
        """
        ps = msg.properties_string
        if ps is not None:
            p = string_to_properties(ps) if ps else {}
            tags, keys, uniq = p.get("TAGS"), p.get("KEYS"), p.get("UNIQ_KEY")
        else:
            tags = msg.tags
            k = msg.keys
            keys = (k if isinstance(k, str) else " ".join(k)) if k else None
            uniq = msg.uniq_key or uniq_key
            if msg.properties:
                ps = build_properties_string(msg, uniq)
            else:
                ps = ((f"TAGS\x01{tags}\x02" if tags else "") + (f"KEYS\x01{keys}\x02" if keys else "")
                      + (f"UNIQ_KEY\x01{uniq}\x02" if uniq else ""))
        bt = msg.born_timestamp or born_timestamp or int(time.time() * 1000)
        if msg.topic == SCHEDULE_TOPIC:
            self.schedule_delay(ps)  # a DELAY Java could not parse back is refused here, not stored
        if self.append_crc:
            return self._prepare_with_crc(msg, ps, tags, keys, uniq, bt)
        pb = ps.encode("utf-8")
        pl = len(pb)
        if pl > MAX_PROPERTIES_LENGTH:
            raise EncodeError("PROPERTIES_SIZE_EXCEEDED", f"properties are {pl} bytes, more than {MAX_PROPERTIES_LENGTH}")
        body = msg.body
        if body is None:
            raise EncodeError("MESSAGE_ILLEGAL", "message body is null")
        bl = len(body)
        if bl > self.max_message_size:
            raise EncodeError(
                "MESSAGE_ILLEGAL", f"message body is {bl} bytes, more than max_message_size {self.max_message_size}")
        topic_part, magic = self._topic_part(msg.topic, msg.force_v2)
        if msg.born_host:
            born_addr, born_port = parse_host(msg.born_host)
        else:
            born_addr, born_port = self.store_host
        sys_flag = (msg.sys_flag & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)) | self._store_v6
        if len(born_addr) == 16:
            sys_flag |= BORNHOST_V6_FLAG
            mid = _MID16.pack(sys_flag, bt, born_addr, born_port)
        else:
            mid = _MID4.pack(sys_flag, bt, born_addr, born_port)
        store_addr, store_port = self.store_host
        ptx = msg.prepared_transaction_offset
        tail = (_TAIL16 if self._store_v6 else _TAIL4).pack(store_addr, store_port, msg.reconsume_times, ptx, bl)
        total = 44 + len(mid) + len(tail) + bl + len(topic_part) + 2 + pl  # head+offsets 36, store time 8
        if total > self.max_message_size + RECORD_HEADROOM:
            raise EncodeError("MESSAGE_ILLEGAL", f"record of {total} bytes exceeds the maximum record size")
        return _PREPARED_NEW(PreparedRecord, (
            total, _HEAD.pack(total, magic, zlib.crc32(body) & 0x7FFFFFFF, msg.queue_id, msg.flag), mid,
            b"".join((tail, body, topic_part, _SHORT.pack(pl), pb)), msg.topic, msg.queue_id, sys_flag,
            tags_string_to_tags_code(tags), keys, uniq, ps, ptx, None))

    def _prepare_with_crc(self, msg: Message, ps: str, tags: str | None, keys: str | None,
                          uniq: str | None, born_timestamp: int) -> PreparedRecord:
        self._topic_part(msg.topic, msg.force_v2)  # caches the topic for the batch fast paths
        born = parse_host(msg.born_host) if msg.born_host else self.store_host
        buf = encode_record(
            topic=msg.topic, body=msg.body, properties_string=ps, queue_id=msg.queue_id, flag=msg.flag,
            sys_flag=msg.sys_flag, born_timestamp=born_timestamp, born_host=born,
            store_host=self.store_host, reconsume_times=msg.reconsume_times,
            prepared_transaction_offset=msg.prepared_transaction_offset, force_v2=msg.force_v2,
            auto_v2=self.auto_v2, append_crc=True, max_message_size=self.max_message_size,
        )
        sys_flag = _INT.unpack_from(buf, SYSFLAG_POSITION)[0]
        return PreparedRecord(len(buf), b"", b"", b"", msg.topic, msg.queue_id, sys_flag,
                              tags_string_to_tags_code(tags), keys, uniq, ps, msg.prepared_transaction_offset, buf)

    def schedule_delay(self, properties_string: str) -> int | None:
        """The delay in ms of a `SCHEDULE_TOPIC_XXXX` record's level (its DELAY property clamped to the
        last level), None when it has no DELAY or a level <= 0. Raises `EncodeError` for a DELAY that is
        not an int (Java's reput would fail on the record)."""
        if not properties_string:
            return None
        delay = _property("\x02" + properties_string, "\x02DELAY\x01")
        if delay is None:
            return None
        try:
            return compute_deliver_timestamp(delay, 0, self.delay_levels)
        except ValueError:
            raise EncodeError("MESSAGE_ILLEGAL", f"DELAY property {delay!r} is not an int") from None

    def dispatch_tags_code(self, rec: PreparedRecord, store_timestamp: int) -> int:
        """The consume-queue tagsCode of an emitted record: for `SCHEDULE_TOPIC_XXXX` with a DELAY its
        delivery time (store time + the level's delay, spec §14), else the tag hash from `prepare`."""
        if rec.topic != SCHEDULE_TOPIC:
            return rec.tags_code
        delay = self.schedule_delay(rec.properties_string)
        return rec.tags_code if delay is None else store_timestamp + delay

    @staticmethod
    def emit(rec: PreparedRecord, queue_offset: int, physical_offset: int, store_timestamp: bytes,
             parts: list) -> None:
        """Append the record's final bytes to `parts` (under the put lock). `store_timestamp` is the
        8-byte big-endian store time shared by the whole append (`encode_store_timestamp`)."""
        if rec.buf is not None:
            buf = rec.buf
            _QOFF_PHYS.pack_into(buf, QUEUE_OFFSET_POSITION, queue_offset, physical_offset)
            pos = store_timestamp_position(rec.sys_flag)
            buf[pos:pos + 8] = store_timestamp
            fill_crc_trailer(buf)
            parts.append(buf)
            return
        parts += (rec.head, _QOFF_PHYS.pack(queue_offset, physical_offset), rec.mid, store_timestamp, rec.tail)

    def encode_plain_batch(self, msgs: Sequence[Message], uniq_keys: Sequence[str | None] | None,
                           queue_table: dict[str, int], base_offset: int, now: int,
                           columns: bool = False) -> PlainBatch | None:
        """The batch put's fast path (see `encode_plain_batch_py`, the reference): the C loop of
        `rmq_eventstore._native` when it is active (`NATIVE`) and the batch is one it covers, else the
        Python loop. Both write the `__CRC32#` trailer when `append_crc` is on. With `columns`, the C loop
        hands its dispatch over as one `DispatchColumns` (in `requests`) instead of a request per record;
        the Python loop always gives requests (dispatch takes either)."""
        if native is not None:
            addr, port = self.store_host
            r = native.encode_plain_batch(
                msgs, uniq_keys, queue_table, base_offset, now, self._topics, addr, port,
                (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) if self._store_v6 else 0, self.max_message_size,
                self.max_message_size + RECORD_HEADROOM, _TAGS_CODE_CACHE, tags_string_to_tags_code,
                DispatchRequest, self.append_crc, columns)
            if r is not None:
                if columns:
                    data, cols, offsets, uniqs, seen, first_q = r
                    return PlainBatch(data, DispatchColumns(*cols), offsets, uniqs, seen, first_q)
                return _new_tuple(PlainBatch, r)
        return self.encode_plain_batch_py(msgs, uniq_keys, queue_table, base_offset, now)

    def encode_plain_one(self, msg: Message, uniq_key: str | None, queue_offset: int, offset: int,
                         now: int) -> tuple[bytes, DispatchRequest] | None:
        """`encode_plain_batch` of one message whose queue offset the caller looked up (a single put):
        `(record, request)`, or None when the message is not plain (the batch path then decides). The
        native loop when it is active, else `encode_plain_batch_py`; the same bytes either way."""
        if native is not None:
            ctx = self._plain_ctx
            if ctx is None:
                addr, port = self.store_host
                ctx = self._plain_ctx = (
                    self._topics, addr, port, (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) if self._store_v6 else 0,
                    self.max_message_size, self.max_message_size + RECORD_HEADROOM, _TAGS_CODE_CACHE,
                    tags_string_to_tags_code, DispatchRequest, self.append_crc)
            return native.encode_plain_one(msg, uniq_key, queue_offset, offset, now, ctx)
        return self.encode_plain_one_py(msg, uniq_key, queue_offset, offset, now)

    def plain_context(self) -> tuple:
        """The fixed arguments of the native single-record encoders (`encode_plain_one`,
        `_native.append_one`), bound once per encoder."""
        ctx = self._plain_ctx
        if ctx is None:
            addr, port = self.store_host
            ctx = self._plain_ctx = (
                self._topics, addr, port, (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) if self._store_v6 else 0,
                self.max_message_size, self.max_message_size + RECORD_HEADROOM, _TAGS_CODE_CACHE,
                tags_string_to_tags_code, DispatchRequest, self.append_crc)
        return ctx

    def network_context(self) -> tuple:
        """The fixed arguments of `encode_network_batch`'s native loop, bound once per encoder, for the
        network single put (`_native.append_one_net`)."""
        ctx = self._net_ctx
        if ctx is None:
            addr, port = self.store_host
            ctx = self._net_ctx = (
                self._topics, addr, port, self.max_message_size, self.max_message_size + RECORD_HEADROOM,
                _TAGS_CODE_CACHE, tags_string_to_tags_code, DispatchRequest, parse_host, SCHEDULE_TOPIC,
                self.append_crc)
        return ctx

    def encode_plain_one_into(self, msg: Message, uniq_key: str | None, queue_offset: int, offset: int, now: int,
                              dst: memoryview | bytearray, pos: int, limit: int) -> tuple[int, DispatchRequest] | None:
        """`encode_plain_one` written straight into `dst` at `pos` (a single put's mapped file): `(size,
        request)`, or None, with nothing written, when the message is not plain or its record would take more
        than `limit` bytes. Native when active, else `encode_plain_one_py` and a copy; the same bytes."""
        if native is not None:
            if self._plain_ctx is None:
                self.encode_plain_one(msg, uniq_key, queue_offset, offset, now)  # binds the context
            return native.encode_plain_one(msg, uniq_key, queue_offset, offset, now, self._plain_ctx, dst, pos, limit)
        r = self.encode_plain_one_py(msg, uniq_key, queue_offset, offset, now)
        if r is None or len(r[0]) > limit or pos + len(r[0]) > len(dst):
            return None
        data, req = r
        dst[pos:pos + len(data)] = data
        return len(data), req

    def encode_plain_one_py(self, msg: Message, uniq_key: str | None, queue_offset: int, offset: int,
                            now: int) -> tuple[bytes, DispatchRequest] | None:
        """`encode_plain_one`'s reference: `encode_plain_batch_py` of the message alone."""
        if queue_offset < 0:
            return None
        b = self.encode_plain_batch_py((msg,), (uniq_key,), {f"{msg.topic}-{msg.queue_id}": queue_offset}, offset, now)
        return None if b is None else (b.data, b.requests[0])

    def encode_plain_batch_py(self, msgs: Sequence[Message], uniq_keys: Sequence[str | None] | None,
                              queue_table: dict[str, int], base_offset: int, now: int) -> PlainBatch | None:
        """The batch put's fast path: whole records for plain messages in one loop, offsets included.

        Plain means what most event appends are: no raw properties string, no user properties, no born
        host or born time, no sysFlag bits, no reconsume count, prepared offset 0, no forced V2, a topic
        already encoded once. With `append_crc` each record ends with its `__CRC32#` trailer (the CRC of the
        record's other bytes, `crc_trailer`). The bytes equal `prepare` + `emit`'s (tested).
        Returns None, having changed nothing, as soon as a message is not plain or breaks a size rule; the
        caller then takes the general path, which also reports the error.
        """
        reserved = CRC32_RESERVED_LEN if self.append_crc else 0
        topics = self._topics
        max_body = self.max_message_size
        max_record = max_body + RECORD_HEADROOM
        store_addr, store_port = self.store_host
        v6 = self._store_v6
        sys_flag = (BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG) if v6 else 0
        header = _HEADERS[3 if v6 else 0]
        hsize = header.size
        pack = header.pack
        short = _SHORT.pack
        crc32 = zlib.crc32
        new_request = tuple.__new__
        seen: dict[str, int] = {}
        parts: list = []
        requests: list = []
        offsets: list[int] = []
        add = parts.append
        phys = base_offset
        first_q = -1
        for i, m in enumerate(msgs):
            topic = m.topic
            tp = topics.get(topic)
            body = m.body
            if (tp is None or m.properties_string is not None or m.properties or m.born_host is not None
                    or m.born_timestamp or m.sys_flag or m.reconsume_times or m.prepared_transaction_offset
                    or m.force_v2 or body.__class__ is not bytes):
                return None
            topic_part, magic = tp
            qid = m.queue_id
            tags = m.tags
            k = m.keys
            keys = (k if k.__class__ is str else " ".join(k)) if k else None
            uniq = m.uniq_key or (uniq_keys[i] if uniq_keys is not None else None)
            ps = ((f"TAGS\x01{tags}\x02" if tags else "") + (f"KEYS\x01{keys}\x02" if keys else "")
                  + (f"UNIQ_KEY\x01{uniq}\x02" if uniq else ""))
            pb = ps.encode("utf-8")  # empty or ending with 0x02: no separator to add before a trailer
            pl = len(pb) + reserved
            bl = len(body)
            total = hsize + bl + len(topic_part) + 2 + pl
            if pl > MAX_PROPERTIES_LENGTH or bl > max_body or total > max_record or qid < 0:
                return None
            qkey = f"{topic}-{qid}"
            q = seen.get(qkey)
            if q is None:
                q = queue_table.get(qkey, 0)
            seen[qkey] = q + 1
            if first_q < 0:
                first_q = q
            head = pack(total, magic, crc32(body) & 0x7FFFFFFF, qid, m.flag, q, phys, sys_flag, now, store_addr,
                        store_port, now, store_addr, store_port, 0, 0, bl)
            add(head)
            add(body)
            add(topic_part)
            sp = short(pl)
            add(sp)
            add(pb)
            if reserved:
                add(crc_trailer(crc32(pb, crc32(sp, crc32(topic_part, crc32(body, crc32(head))))) & 0x7FFFFFFF))
            if tags:
                code = _TAGS_CODE_CACHE.get(tags)
                if code is None:
                    code = tags_string_to_tags_code(tags)
            else:
                code = 0
            requests.append(new_request(DispatchRequest, (topic, qid, phys, total, code, now, q, keys, uniq,
                                                          sys_flag, 0, ps)))
            offsets.append(phys)
            phys += total
        return PlainBatch(b"".join(parts), requests, offsets,
                          [r.uniq_key for r in requests], seen, first_q)

    def encode_network_batch(self, msgs: Sequence[Message], queue_table: dict[str, int], base_offset: int,
                             now: int) -> PlainBatch | None:
        """The network put's fast path (see `encode_network_batch_py`, the reference): the C loop of
        `rmq_eventstore._native` when it is active (`NATIVE`) and the batch is one it covers, else the
        Python loop. Both write the `__CRC32#` trailer when `append_crc` is on."""
        if native is not None:
            addr, port = self.store_host
            r = native.encode_network_batch(
                msgs, queue_table, base_offset, now, self._topics, addr, port, self.max_message_size,
                self.max_message_size + RECORD_HEADROOM, _TAGS_CODE_CACHE, tags_string_to_tags_code,
                DispatchRequest, parse_host, SCHEDULE_TOPIC, self.append_crc)
            if r is not None:
                return _new_tuple(PlainBatch, r)
        return self.encode_network_batch_py(msgs, queue_table, base_offset, now)

    def encode_network_batch_py(self, msgs: Sequence[Message], queue_table: dict[str, int], base_offset: int,
                                now: int) -> PlainBatch | None:
        """The put fast path for what a producer sends over the network: whole records in one loop,
        offsets included, for messages that carry a properties string (encoded by the client, with the
        broker's UNIQ_KEY / CLUSTER added). Only TAGS, KEYS and UNIQ_KEY are looked up in it (three
        searches, no parse). Born host, born time (0: `now`), sysFlag, reconsume times and flag come from
        the message. Not taken (None, nothing changed) for a transaction type other than NOT/COMMIT, a
        forced V2 topic, a topic not yet encoded once, `SCHEDULE_TOPIC_XXXX`, an empty TAGS/KEYS/UNIQ_KEY
        value (the general parse decides which duplicate wins), with `append_crc` a `__CRC32#` already in the
        properties (the general path deletes it), or a size rule broken: the caller then takes the general
        path. With `append_crc` a 0x02 is added to properties that do not end with one and each record ends
        with its `__CRC32#` trailer (`crc_trailer`). The bytes and DispatchRequests equal `prepare` +
        `emit`'s (tested).
        """
        reserved = CRC32_RESERVED_LEN if self.append_crc else 0
        topics = self._topics
        max_body = self.max_message_size
        max_record = max_body + RECORD_HEADROOM
        store_addr, store_port = self.store_host
        store_v6 = self._store_v6
        v6_mask = ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        headers = _HEADERS
        short = _SHORT.pack
        crc32 = zlib.crc32
        hosts = parse_host
        tags_cache = _TAGS_CODE_CACHE
        new_request = tuple.__new__
        seen: dict[str, int] = {}
        parts: list = []
        requests: list = []
        offsets: list[int] = []
        uniqs: list[str | None] = []
        add = parts.append
        phys = base_offset
        first_q = -1
        last_topic = last_qid = qkey = None
        for m in msgs:
            topic = m.topic
            tp = topics.get(topic)
            body = m.body
            ps = m.properties_string
            sys_flag = m.sys_flag
            tx = sys_flag & TRANSACTION_ROLLBACK_TYPE
            if (tp is None or ps.__class__ is not str or m.force_v2 or body.__class__ is not bytes
                    or (tx != 0 and tx != TRANSACTION_COMMIT_TYPE) or topic == SCHEDULE_TOPIC):
                return None
            if ps:
                framed = "\x02" + ps
                i = framed.rfind("\x02TAGS\x01")
                if i < 0:
                    tags = None
                else:
                    j = framed.find("\x02", i + 6)
                    tags = framed[i + 6:] if j < 0 else framed[i + 6:j]
                    if not tags:
                        return None
                i = framed.rfind("\x02KEYS\x01")
                if i < 0:
                    keys = None
                else:
                    j = framed.find("\x02", i + 6)
                    keys = framed[i + 6:] if j < 0 else framed[i + 6:j]
                    if not keys:
                        return None
                i = framed.rfind("\x02UNIQ_KEY\x01")
                if i < 0:
                    uniq = None
                else:
                    j = framed.find("\x02", i + 10)
                    uniq = framed[i + 10:] if j < 0 else framed[i + 10:j]
                    if not uniq:
                        return None
            else:
                tags = keys = uniq = None
            topic_part, magic = tp
            qid = m.queue_id
            born = m.born_host
            if born:
                born_addr, born_port = hosts(born)
            else:
                born_addr, born_port = store_addr, store_port
            sys_flag = (sys_flag & v6_mask) | store_v6
            if len(born_addr) == 16:
                sys_flag |= BORNHOST_V6_FLAG
                header = headers[3 if store_v6 else 2]
            else:
                header = headers[1 if store_v6 else 0]
            pb = ps.encode("utf-8")
            if reserved:
                if PROPERTY_CRC32 in ps:
                    return None
                if ps and ps[-1] != "\x02":
                    pb += b"\x02"
            pl = len(pb) + reserved
            bl = len(body)
            total = header.size + bl + len(topic_part) + 2 + pl
            if pl > MAX_PROPERTIES_LENGTH or bl > max_body or total > max_record or qid < 0:
                return None
            if topic is not last_topic or qid != last_qid:
                qkey = f"{topic}-{qid}"
                last_topic, last_qid = topic, qid
            q = seen.get(qkey)
            if q is None:
                q = queue_table.get(qkey, 0)
            seen[qkey] = q + 1
            if first_q < 0:
                first_q = q
            ptx = m.prepared_transaction_offset
            head = header.pack(total, magic, crc32(body) & 0x7FFFFFFF, qid, m.flag, q, phys, sys_flag,
                               m.born_timestamp or now, born_addr, born_port, now, store_addr, store_port,
                               m.reconsume_times, ptx, bl)
            add(head)
            add(body)
            add(topic_part)
            sp = short(pl)
            add(sp)
            add(pb)
            if reserved:
                add(crc_trailer(crc32(pb, crc32(sp, crc32(topic_part, crc32(body, crc32(head))))) & 0x7FFFFFFF))
            if tags:
                code = tags_cache.get(tags)
                if code is None:
                    code = tags_string_to_tags_code(tags)
            else:
                code = 0
            requests.append(new_request(DispatchRequest, (topic, qid, phys, total, code, now, q, keys, uniq,
                                                          sys_flag, ptx, ps)))
            offsets.append(phys)
            uniqs.append(uniq)
            phys += total
        return PlainBatch(b"".join(parts), requests, offsets, uniqs, seen, first_q)


def encode_store_timestamp(ms: int) -> bytes:
    """STORETIMESTAMP as stored (8 bytes, big-endian)."""
    return _LONG.pack(ms)


def encode_blank(remaining: int) -> bytes:
    """The 8-byte BLANK header that closes a file: `[int remaining][int BLANK_MAGIC_CODE]`."""
    return _BLANK.pack(remaining, BLANK_MAGIC_CODE)


# -- decoding --------------------------------------------------------------------------------------
class CorruptRecordError(ValueError):
    """A record that fails the checks of `CommitLog.checkMessageAndReturnSize`."""

    def __init__(self, offset: int, reason: str, size: int = -1) -> None:
        super().__init__(f"corrupt record at offset {offset}: {reason}")
        self.offset = offset
        self.reason = reason
        self.size = size


class DispatchRequest(NamedTuple):
    """What the reput service hands to the dispatchers (`S/DispatchRequest.java`)."""

    topic: str
    queue_id: int
    commit_log_offset: int
    msg_size: int
    tags_code: int
    store_timestamp: int
    consume_queue_offset: int
    keys: str | None
    uniq_key: str | None
    sys_flag: int
    prepared_transaction_offset: int
    properties_string: str


class DispatchColumns:
    """What a batch put hands to dispatch as columns instead of one `DispatchRequest` per record (issue 16).

    The native encoder fills them in the pass that writes the records: the consume-queue units per queue
    (int64 rows `(commitLogOffset, size, tagsCode, cqOffset)`, what `group_units` makes of requests) and the
    index entries of every record (int32 key hashes, int64 offsets, int64 store times, what `index_keys`
    makes), so nothing is built per record between the put and the consume queues and index files.
    `len()` is the number of records.
    """

    __slots__ = ("count", "units", "hashes", "phy", "ts", "store_timestamp")

    def __init__(self, count: int, units: list[tuple[tuple[str, int], bytes]], hashes: bytes, phy: bytes,
                 ts: bytes, store_timestamp: int) -> None:
        self.count = count
        self.units = units  # [((topic, queue id), int64 rows bytes)], queues in order of first appearance
        self.hashes = hashes
        self.phy = phy
        self.ts = ts
        self.store_timestamp = store_timestamp  # of the last record

    def __len__(self) -> int:
        return self.count

    def __repr__(self) -> str:
        return f"DispatchColumns({self.count} records, {len(self.units)} queues, {len(self.hashes) // 4} keys)"

    @classmethod
    def merge(cls, parts: Sequence[DispatchColumns]) -> DispatchColumns:
        """Consecutive hand-offs as one (units of a queue concatenated in log order)."""
        if len(parts) == 1:
            return parts[0]
        units: dict[tuple[str, int], list[bytes]] = {}
        for p in parts:
            for key, u in p.units:
                g = units.get(key)
                if g is None:
                    units[key] = [u]
                else:
                    g.append(u)
        return cls(sum(p.count for p in parts), [(k, b"".join(v)) for k, v in units.items()],
                   b"".join(p.hashes for p in parts), b"".join(p.phy for p in parts), b"".join(p.ts for p in parts),
                   parts[-1].store_timestamp)

    def grown(self) -> dict[tuple[str, int], int]:
        """(topic, queue id) -> the queue's max offset after these records (the arrival listeners' argument)."""
        return {key: _NATIVE_LONG.unpack_from(u, len(u) - 8)[0] + 1 for key, u in self.units if u}


_NATIVE_LONG = struct.Struct("=q")


class CheckResult(NamedTuple):
    """`checkMessageAndReturnSize`'s verdict: size 0 + success is a BLANK, -1 + failure end of data,
    size > 0 + failure a length mismatch ("half message")."""

    size: int
    success: bool
    request: DispatchRequest | None
    reason: str = ""


_MAGICS = (MESSAGE_MAGIC_CODE, MESSAGE_MAGIC_CODE_V2)
_new_tuple = tuple.__new__


def _property(framed: str, marker: str) -> str | None:
    """One property's value from `"\x02" + properties`, as `string_to_properties` would give it: the
    last occurrence wins (Java's HashMap keeps the last put) and an empty value counts as absent."""
    i = framed.rfind(marker)
    if i < 0:
        return None
    i += len(marker)
    j = framed.find("\x02", i)
    value = framed[i:] if j < 0 else framed[i:j]
    return value or None


def read_size_magic(buf: Buffer, pos: int) -> tuple[int, int]:
    """TOTALSIZE and MAGIC of the record at `pos`."""
    return _SIZE_MAGIC.unpack_from(buf, pos)


def _read_tail(buf: Buffer, pos: int, end_limit: int, v2: bool) -> tuple[str, str, int]:
    """Topic and properties after the body at `pos`; returns (topic, properties, position after)."""
    if v2:
        tl = _SHORT.unpack_from(buf, pos)[0]
        pos += 2
    else:
        tl = buf[pos]
        if tl > 127:  # Java reads a signed byte
            raise ValueError("V1 topic length byte is negative")
        pos += 1
    if tl < 0 or pos + tl + 2 > end_limit:
        raise ValueError("topic length runs past the record")
    topic = bytes(buf[pos:pos + tl]).decode("utf-8", "replace")
    pos += tl
    pl = _SHORT.unpack_from(buf, pos)[0]
    pos += 2
    if pl < 0 or pos + pl > end_limit:
        raise ValueError("properties length runs past the record")
    props = bytes(buf[pos:pos + pl]).decode("utf-8", "replace") if pl else ""
    return topic, props, pos + pl


def check_message_and_return_size(
    buf, pos: int, check_crc: bool = False, limit: int | None = None, base_offset: int = 0,
    verify_prop_crc: bool = False, delay_levels: Sequence[int] = DEFAULT_DELAY_LEVELS_MS,
) -> CheckResult:
    """`CommitLog.checkMessageAndReturnSize` (spec §1.8) on the record at `buf[pos:]`, `limit` its end bound.

    Never raises: zeroed space and unknown magic give (-1, False), BLANK gives (0, True), a length that
    disagrees with the fields gives (total size, False). A `SCHEDULE_TOPIC_XXXX` record with a DELAY
    property gets its delivery time as tagsCode (`delay_levels`: ms per level, the store's
    `messageDelayLevel`); a DELAY that is not an int fails the record as in Java.
    """
    end = len(buf) if limit is None else limit
    try:
        if end - pos < 8:
            return CheckResult(-1, False, None, "no room for a record header")
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if magic == BLANK_MAGIC_CODE:
            return CheckResult(0, True, None)
        if magic not in _MAGICS:
            return CheckResult(-1, False, None, f"illegal magic code {magic & 0xFFFFFFFF:#010x}")
        if total <= 0 or pos + total > end:
            return CheckResult(-1, False, None, f"total size {total} runs past the readable data")
        sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POSITION)[0]
        header = _HEADERS[_header_index(sys_flag)]
        if total < header.size:
            return CheckResult(total, False, None, "record shorter than its header")
        (_, _, crc, queue_id, _flag, queue_offset, phys, _sf, _born_ts, _ba, _bp, store_ts, _sa, _sp,
         _rc, prep_tx, body_len) = header.unpack_from(buf, pos)
        rec_end = pos + total
        bpos = pos + header.size
        if body_len < 0 or bpos + body_len > rec_end:
            return CheckResult(total, False, None, "body length runs past the record")
        # Java's order: body CRC (right after reading the body), properties, __CRC32#, then the length.
        if check_crc and not verify_prop_crc and body_len and (
                zlib.crc32(memoryview(buf)[bpos:bpos + body_len]) & 0x7FFFFFFF) != crc:
            return CheckResult(-1, False, None, "body CRC mismatch")
        v2 = magic == MESSAGE_MAGIC_CODE_V2
        tpos = bpos + body_len
        if v2:
            topic_len = _SHORT.unpack_from(buf, tpos)[0]
            tpos += 2
        else:
            topic_len = buf[tpos]
            if topic_len > 127:  # Java reads a signed byte
                raise ValueError("V1 topic length byte is negative")
            tpos += 1
        ppos = tpos + topic_len
        if topic_len < 0 or ppos + 2 > rec_end:
            raise ValueError("topic length runs past the record")
        prop_len = _SHORT.unpack_from(buf, ppos)[0]
        ppos += 2
        if prop_len < 0 or ppos + prop_len > rec_end:
            raise ValueError("properties length runs past the record")
        mv = memoryview(buf)
        topic = str(mv[tpos:tpos + topic_len], "utf-8", "replace")
        props = str(mv[ppos:ppos + prop_len], "utf-8", "replace") if prop_len else ""
        if check_crc and verify_prop_crc:
            p = string_to_properties(props)
            v = p.get(PROPERTY_CRC32)
            want = zlib.crc32(memoryview(buf)[pos:rec_end - CRC32_RESERVED_LEN]) & 0x7FFFFFFF
            if v is None:
                return CheckResult(-1, False, None, PROP_CRC_MISSING)
            if not v.isdigit() or parse_crc32_property_value(v) != want:
                return CheckResult(-1, False, None, "__CRC32# property mismatch")
        expected = cal_msg_length(body_len, topic_len, prop_len, sys_flag, v2)
        if expected != total:
            return CheckResult(total, False, None, f"total size {total} != computed {expected}")
        if props:
            framed = "\x02" + props
            tags = _property(framed, "\x02TAGS\x01")
            keys = _property(framed, "\x02KEYS\x01")
            uniq = _property(framed, "\x02UNIQ_KEY\x01")
            code = (_TAGS_CODE_CACHE.get(tags) or tags_string_to_tags_code(tags)) if tags else 0
            if topic == SCHEDULE_TOPIC:
                delay = _property(framed, "\x02DELAY\x01")
                if delay is not None:
                    deliver = compute_deliver_timestamp(delay, store_ts, delay_levels)
                    if deliver is not None:
                        code = deliver
        else:
            tags = keys = uniq = None
            code = 0
        return _new_tuple(CheckResult, (total, True, _new_tuple(DispatchRequest, (
            topic, queue_id, phys, total, code, store_ts, queue_offset, keys, uniq, sys_flag, prep_tx, props)),
            ""))
    except (struct.error, ValueError, IndexError) as e:
        return CheckResult(-1, False, None, f"unreadable record: {e}")


def decode_message(buf: Buffer, pos: int = 0, *, check_crc: bool = False, limit: int | None = None,
                   copy_body: bool = True, decompress: bool = False) -> MessageExt:
    """Decode the record at `buf[pos:]` into a `MessageExt`; raises `CorruptRecordError` when it is not one.

    With `decompress`, a ZLIB-compressed body is inflated and the COMPRESSED bit cleared, as
    `MessageDecoder.decode(..., deCompressBody=true)` does (other codecs are left as stored).
    """
    end = len(buf) if limit is None else limit
    try:
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
    except struct.error:
        raise CorruptRecordError(pos, "truncated header") from None
    if magic == BLANK_MAGIC_CODE:
        raise CorruptRecordError(pos, "BLANK end-of-file record, not a message", 0)
    if magic not in _MAGICS:
        raise CorruptRecordError(pos, f"illegal magic code {magic & 0xFFFFFFFF:#010x}")
    if total <= 0 or pos + total > end:
        raise CorruptRecordError(pos, f"total size {total} runs past the data")
    try:
        sys_flag = _INT.unpack_from(buf, pos + SYSFLAG_POSITION)[0]
        header = _HEADERS[_header_index(sys_flag)]
        (_, _, crc, queue_id, flag, queue_offset, phys, _sf, born_ts, born_addr, born_port, store_ts,
         store_addr, store_port, reconsume, prep_tx, body_len) = header.unpack_from(buf, pos)
        bpos = pos + header.size
        rec_end = pos + total
        if body_len < 0 or bpos + body_len > rec_end:
            raise ValueError("body length runs past the record")
        topic, props, after = _read_tail(buf, bpos + body_len, rec_end, magic == MESSAGE_MAGIC_CODE_V2)
    except (struct.error, ValueError, IndexError) as e:
        raise CorruptRecordError(pos, str(e)) from None
    if after != rec_end:
        raise CorruptRecordError(pos, f"total size {total} != computed {after - pos}", total)
    body = buf[bpos:bpos + body_len]
    if copy_body:
        body = bytes(body)
    if check_crc and body_len and (zlib.crc32(body) & 0x7FFFFFFF) != crc:
        raise CorruptRecordError(pos, "body CRC mismatch")
    if decompress and sys_flag & COMPRESSED_FLAG and (sys_flag & COMPRESSION_TYPE_COMPARATOR) in (0, 0x300):
        try:
            body = zlib.decompress(bytes(body))
            sys_flag &= ~COMPRESSED_FLAG
        except zlib.error:
            pass
    return MessageExt(total, magic, crc, queue_id, flag, queue_offset, phys, sys_flag, born_ts,
                      born_addr, born_port, store_ts, store_addr, store_port, reconsume, prep_tx, body,
                      topic, props)


def decode_records(buf: Buffer, *, decompress: bool = False) -> list[MessageExt]:
    """Every record of `buf`, whole records back to back (a pull or query response body), as
    `decode_message` would decode them one by one (same fields, same `CorruptRecordError`s): the client's
    pull path. `rmq_eventstore._native` decodes the records `decode_records_py`'s fast branch would
    (when it is active, `NATIVE`); each other record goes to `decode_message`, as in the Python loop."""
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    if pull_native is None:
        return decode_records_py(buf, decompress=decompress)
    return decode_records_with(pull_native, buf, decompress)


def decode_records_with(impl: Any, buf: bytes, decompress: bool) -> list[MessageExt]:
    """`decode_records` on `impl.decode_records` (the native module; tests pass it whatever
    `RMQ_EVENTSTORE_PURE` says): the records it stops at are `decode_message`'s."""
    out: list[MessageExt] = []
    n = len(buf)
    pos = impl.decode_records(buf, 0, out, decompress)
    while pos < n:
        m = decode_message(buf, pos, decompress=decompress)
        out.append(m)
        pos = impl.decode_records(buf, pos + m.store_size, out, decompress)
    return out


def decode_records_py(buf: Buffer, *, decompress: bool = False) -> list[MessageExt]:
    """`decode_records` in Python, in one loop; topic strings are decoded once per distinct topic."""
    if not isinstance(buf, bytes):
        buf = bytes(buf)
    out: list[MessageExt] = []
    append = out.append
    n = len(buf)
    pos = 0
    headers = _HEADERS
    h_v4 = headers[0]
    unpack_v4 = h_v4.unpack_from
    size_v4 = h_v4.size
    int_at = _INT.unpack_from
    short_at = _SHORT.unpack_from
    v6_flags = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG
    magic_v1 = MESSAGE_MAGIC_CODE
    magic_v2 = MESSAGE_MAGIC_CODE_V2
    topics: dict[bytes, str] = {}
    new = MessageExt
    while pos < n:
        try:
            sys_flag = int_at(buf, pos + SYSFLAG_POSITION)[0]
            if sys_flag & v6_flags:
                header = headers[_header_index(sys_flag)]
                fields = header.unpack_from(buf, pos)
                hsize = header.size
            else:
                fields = unpack_v4(buf, pos)
                hsize = size_v4
        except struct.error:
            fields = None
        if fields is not None:
            total = fields[0]
            magic = fields[1]
            rec_end = pos + total
            body_len = fields[16]
            bpos = pos + hsize
            tpos = bpos + body_len
            ok = ((magic == magic_v1 or magic == magic_v2) and total > 0 and rec_end <= n and body_len >= 0
                  and tpos + 4 <= rec_end)
        else:
            ok = False
        if ok:
            if magic == magic_v1:
                tl = buf[tpos]
                tpos += 1
            else:
                tl = short_at(buf, tpos)[0]
                tpos += 2
            ppos = tpos + tl
            ok = 0 <= tl and (tl <= 127 or magic != magic_v1) and ppos + 2 <= rec_end
            if ok:
                pl = short_at(buf, ppos)[0]
                ppos += 2
                ok = pl >= 0 and ppos + pl == rec_end
        if not ok:  # anything unusual: the one-record decoder decides (and raises the precise error)
            m = decode_message(buf, pos, decompress=decompress)
            append(m)
            pos += m.store_size
            continue
        tb = buf[tpos:tpos + tl]
        topic = topics.get(tb)
        if topic is None:
            topic = topics[tb] = tb.decode("utf-8", "replace")
        body = buf[bpos:bpos + body_len]
        if decompress and sys_flag & COMPRESSED_FLAG and (sys_flag & COMPRESSION_TYPE_COMPARATOR) in (0, 0x300):
            append(decode_message(buf, pos, decompress=True))
        else:
            append(new(*fields[:16], body, topic, buf[ppos:rec_end].decode("utf-8", "replace") if pl else ""))
        pos = rec_end
    return out


def iter_records(buf: Buffer, start: int = 0, limit: int | None = None,
                 check_crc: bool = False) -> Iterator[tuple[int, CheckResult]]:
    """Walk records from `start`: yields (position, CheckResult) up to a BLANK, zeroed space or damage."""
    end = len(buf) if limit is None else limit
    pos = start
    while pos < end:
        r = check_message_and_return_size(buf, pos, check_crc, end)
        yield pos, r
        if not r.success or r.size == 0:
            return
        pos += r.size


# -- client batch body (MessageDecoder.encodeMessage / decodeMessages) -------------------------------
_BATCH_HEAD = struct.Struct(">iiiii")


def encode_batch_body(messages: list[tuple[bytes, int, str]]) -> bytes:
    """A SEND_BATCH_MESSAGE body: per message `[size][magic 0][crc 0][flag][bodyLen][body][propLen][props]`
    (`encode_batch_body_py`, the reference; the C loop of `_native` when active, which leaves to the
    reference whatever it does not cover: a non-bytes body, a size or flag out of range, bad UTF-8)."""
    if batch_native is not None:
        r = batch_native.encode_batch_body(messages)
        if r is not None:
            return r
    return encode_batch_body_py(messages)


def encode_batch_messages(msgs: Sequence[Message], uniqs: list[str]) -> tuple[bytes, list[str]] | None:
    """The producer's batch body and client message ids, in C (`_native.encode_batch_messages`), for Messages
    without a properties_string; None when the native core is off or a message needs the Python loop
    (`Producer._batch_body_py`, the reference)."""
    if batch_native is None:
        return None
    return batch_native.encode_batch_messages(msgs, uniqs)


def decorate_batch(msgs: list[Message], topic: str, queue_id: int, uniq_marker: str | None, cluster_marker: str,
                   cluster: str) -> bool:
    """`SendMessageProcessor._store`'s loop for a plain batch in C (`_native.decorate_batch`): topic, queue
    and CLUSTER property set on every message; False (nothing changed) when the native core is off or a
    message needs the Python loop (no `uniq_marker` while UNIQ_KEYs are created, a timer or delay property)."""
    return batch_native is not None and batch_native.decorate_batch(msgs, topic, queue_id, uniq_marker,
                                                                     cluster_marker, cluster)


def encode_batch_body_py(messages: list[tuple[bytes, int, str]]) -> bytes:
    """`encode_batch_body` in Python (the reference)."""
    out = []
    for body, flag, props in messages:
        pb = props.encode("utf-8")
        size = 20 + len(body) + 2 + len(pb)
        out.append(_BATCH_HEAD.pack(size, 0, 0, flag, len(body)))
        out.append(body)
        out.append(_SHORT.pack(len(pb)))
        out.append(pb)
    return b"".join(out)


def decode_batch_body(data: bytes) -> list[tuple[bytes, int, str]]:
    """Inverse of `encode_batch_body`: [(body, flag, properties string)]; ValueError when malformed."""
    out = []
    pos = 0
    n = len(data)
    while pos < n:
        if n - pos < 22:
            raise ValueError(f"batch body truncated at {pos}")
        size, _magic, _crc, flag, blen = _BATCH_HEAD.unpack_from(data, pos)
        if size < 22 or pos + size > n or blen < 0 or 20 + blen + 2 > size:
            raise ValueError(f"bad inner message size at {pos}")
        body = data[pos + 20:pos + 20 + blen]
        plen = _SHORT.unpack_from(data, pos + 20 + blen)[0]
        if plen < 0 or 22 + blen + plen != size:
            raise ValueError(f"bad inner properties length at {pos}")
        props = data[pos + 22 + blen:pos + size].decode("utf-8", "replace")
        out.append((body, flag, props))
        pos += size
    return out


def decode_batch_messages(data: bytes, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                          born_host: str | None, reconsume_times: int) -> list[Message]:
    """The broker's Messages of a SEND_BATCH_MESSAGE body (`decode_batch_messages_py`, the reference; the
    C loop of `_native` when active). ValueError (the same text) when the body is malformed."""
    if batch_native is not None:
        r = batch_native.decode_batch_messages(data, topic, queue_id, sys_flag, born_timestamp, born_host,
                                               reconsume_times)
        if r is not None:
            return r
    return decode_batch_messages_py(data, topic, queue_id, sys_flag, born_timestamp, born_host, reconsume_times)


def decode_batch_messages_py(data: bytes, topic: str, queue_id: int, sys_flag: int, born_timestamp: int,
                             born_host: str | None, reconsume_times: int) -> list[Message]:
    """`decode_batch_messages` in Python: one Message per (body, flag, properties) of `decode_batch_body`,
    with the request header's topic, queue, sysFlag, born time and host and reconsume times."""
    return [Message(topic=topic, body=b, queue_id=queue_id, flag=f, properties_string=p, sys_flag=sys_flag,
                    born_timestamp=born_timestamp, born_host=born_host, reconsume_times=reconsume_times)
            for b, f, p in decode_batch_body(data)]


# -- fast structural skim (recovery, verify) -------------------------------------------------------
class SkimmedRecord(NamedTuple):
    """The fields of one `skim_records` entry (returned as plain tuples in this order, for speed)."""

    offset: int  # position in the buffer
    size: int
    queue_id: int
    queue_offset: int
    sys_flag: int
    store_timestamp: int
    topic: bytes


SKIM_OK, SKIM_BLANK, SKIM_END, SKIM_DAMAGE = "ok", "blank", "end", "damage"
# total, magic, crc, queueId, queueOffset, sysFlag, storeTimestamp, bodyLen: the header fields the skim
# needs, the others skipped as padding; indexed like _HEADERS (born v6 * 2 + store v6)
_SKIM_HEADERS = tuple(struct.Struct(f">iiii4xq8xi8x{b}xq{h}x4x8xi") for b in (8, 20) for h in (8, 20))
assert tuple(h.size for h in _SKIM_HEADERS) == _HEADER_SIZES
_V6_FLAGS = BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG


_SKIM_STATES = (SKIM_OK, SKIM_BLANK, SKIM_END, SKIM_DAMAGE)


def skim_records(buf: Buffer, pos: int, limit: int, check_crc: bool, max_records: int = 1 << 16,
                 keep: bool = True) -> tuple[list[tuple], int, str, str]:
    """The walk of recovery and `verify` (see `skim_records_py`, the reference): the C loop of
    `rmq_eventstore._native` when it is active (`NATIVE`), else the Python loop. Same results."""
    if native is not None:
        r = native.skim_records(buf, pos, limit, check_crc, max_records, keep, _SKIM_STATES)
        if r is not None:
            return r
    return skim_records_py(buf, pos, limit, check_crc, max_records, keep)


def skim_records_prop_crc(buf: Buffer, pos: int, limit: int, check_crc: bool, max_records: int = 1 << 16
                          ) -> tuple[list[tuple], int, str, str, list[int]]:
    """`skim_records` (records kept) that also checks the `__CRC32#` trailer at each record's end, for
    `force_verify_prop_crc` (recovery's walk). The fifth item lists the indexes of the records it left
    undecided, in order: the caller runs `recovery.prop_crc_damage` (the reference) on those. The C loop
    decides every record that ends with the trailer (`prop_crc_damage`'s first test: equal CRC kept, another
    CRC is damage "__CRC32# property mismatch" before the record) and leaves the others; without it (pure
    Python) every record is left undecided, so the results are `prop_crc_damage`'s either way."""
    if native is not None:
        r = native.skim_records(buf, pos, limit, check_crc, max_records, True, _SKIM_STATES, True)
        if r is not None:
            return r
    recs, nxt, state, reason = skim_records_py(buf, pos, limit, check_crc, max_records, True)
    return recs, nxt, state, reason, list(range(len(recs)))


def skim_records_py(buf: Buffer, pos: int, limit: int, check_crc: bool, max_records: int = 1 << 16,
                    keep: bool = True) -> tuple[list[tuple], int, str, str]:
    """Hop from record to record by TOTALSIZE with the checks of `check_message_and_return_size`
    (magic, lengths, the computed total size, the body CRC when `check_crc`) but without decoding
    properties: the fast walk of recovery and `verify` (a few microseconds per record).

    Returns `(records, next_pos, state, reason)`: `records` are `SkimmedRecord`-ordered plain tuples;
    state `ok` (stopped after `max_records`; call again from `next_pos`), `blank` (a BLANK record at
    `next_pos` closes the file), `end` (zeroed space or `limit` at `next_pos`) or `damage` (the record at
    `next_pos` fails a check; `reason` says which). With `keep=False` no records are returned.
    `buf` may be an mmap, bytes or a memoryview (an mmap or bytes is sliced without an extra copy).
    """
    out: list[tuple] = []
    append = out.append
    mv = memoryview(buf)
    raw = buf if isinstance(buf, (bytes, mmap.mmap)) else None
    skim_v4 = _SKIM_HEADERS[0].unpack_from
    headers = _SKIM_HEADERS
    v6_flags = _V6_FLAGS
    magic_v1 = MESSAGE_MAGIC_CODE
    magic_v2 = MESSAGE_MAGIC_CODE_V2
    blank_magic = BLANK_MAGIC_CODE
    size_magic = _SIZE_MAGIC.unpack_from
    short = _SHORT.unpack_from
    crc32 = zlib.crc32
    n = 0
    try:
        while pos < limit:
            if n >= max_records:
                return out, pos, SKIM_OK, ""
            if limit - pos < 8:
                return out, pos, SKIM_END, ""
            total, magic = size_magic(mv, pos)
            if magic != magic_v1 and magic != magic_v2:
                if magic == blank_magic:
                    return out, pos, SKIM_BLANK, ""
                if total == 0 and magic == 0:
                    return out, pos, SKIM_END, ""
                return out, pos, SKIM_DAMAGE, f"illegal magic code {magic & 0xFFFFFFFF:#010x}"
            rec_end = pos + total
            if total < 91 or rec_end > limit:
                if total <= 0 or rec_end > limit:
                    return out, pos, SKIM_DAMAGE, f"total size {total} runs past the readable data"
                return out, pos, SKIM_DAMAGE, "record shorter than its header"
            _t, _m, crc, queue_id, queue_offset, sys_flag, store_ts, body_len = skim_v4(mv, pos)
            hsize = 88
            if sys_flag & v6_flags:
                h = headers[(2 if sys_flag & BORNHOST_V6_FLAG else 0)
                            + (1 if sys_flag & STOREHOSTADDRESS_V6_FLAG else 0)]
                hsize = h.size
                if total < hsize + 3:
                    return out, pos, SKIM_DAMAGE, "record shorter than its header"
                _t, _m, crc, queue_id, queue_offset, sys_flag, store_ts, body_len = h.unpack_from(mv, pos)
            bpos = pos + hsize
            tpos = bpos + body_len
            if body_len < 0 or tpos > rec_end:
                return out, pos, SKIM_DAMAGE, "body length runs past the record"
            if check_crc and body_len and (crc32(mv[bpos:tpos]) & 0x7FFFFFFF) != crc:
                return out, pos, SKIM_DAMAGE, "body CRC mismatch"
            if magic == magic_v2:
                topic_len = short(mv, tpos)[0]
                tpos += 2
                fixed = 76
            else:
                topic_len = mv[tpos]
                tpos += 1
                fixed = 75
                if topic_len > 127:
                    return out, pos, SKIM_DAMAGE, "V1 topic length byte is negative"
            ppos = tpos + topic_len
            if topic_len < 0 or ppos + 2 > rec_end:
                return out, pos, SKIM_DAMAGE, "topic length runs past the record"
            prop_len = short(mv, ppos)[0]
            # calMsgLength: 74 + topic length field (1, V2: 2) + born and store host sizes + the rest
            expected = (fixed + hsize - 72 + body_len + topic_len + prop_len)
            if prop_len < 0 or expected != total:
                if prop_len < 0 or ppos + 2 + prop_len > rec_end:
                    return out, pos, SKIM_DAMAGE, "properties length runs past the record"
                return out, pos, SKIM_DAMAGE, f"total size {total} != computed {expected}"
            if keep:
                append((pos, total, queue_id, queue_offset, sys_flag, store_ts,
                        raw[tpos:ppos] if raw is not None else mv[tpos:ppos].tobytes()))
            n += 1
            pos = rec_end
        return out, pos, SKIM_END, ""
    except (struct.error, ValueError, IndexError) as e:
        return out, pos, SKIM_DAMAGE, f"unreadable record: {e}"
