"""Message properties: RocketMQ's `MessageConst` names and the `name\\x01value\\x02` properties string
(`MessageDecoder.messageProperties2String` / `string2messageProperties`), with per-name helpers."""

from __future__ import annotations

from .tags import _M32, java_string_hash

# property names (common/.../message/MessageConst.java)
PROPERTY_KEYS = "KEYS"
PROPERTY_TAGS = "TAGS"
PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX = "UNIQ_KEY"
PROPERTY_WAIT_STORE_MSG_OK = "WAIT"
PROPERTY_DELAY_TIME_LEVEL = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QUEUE_ID = "REAL_QID"
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_TRANSACTION_ID = "__transactionId__"
PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET = "TRAN_PREPARED_QUEUE_OFFSET"
PROPERTY_TRANSACTION_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_MIN_OFFSET = "MIN_OFFSET"
PROPERTY_MAX_OFFSET = "MAX_OFFSET"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_MAX_RECONSUME_TIMES = "MAX_RECONSUME_TIMES"
PROPERTY_CONSUME_START_TIMESTAMP = "CONSUME_START_TIME"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_SHARDING_KEY = "__SHARDINGKEY"
PROPERTY_POP_CK = "POP_CK"
PROPERTY_POP_CK_OFFSET = "POP_CK_OFFSET"
PROPERTY_FIRST_POP_TIME = "1ST_POP_TIME"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
PROPERTY_TIMER_ENQUEUE_MS = "TIMER_ENQUEUE_MS"
PROPERTY_TIMER_DEQUEUE_MS = "TIMER_DEQUEUE_MS"
PROPERTY_TIMER_ROLL_TIMES = "TIMER_ROLL_TIMES"
PROPERTY_TIMER_DEL_UNIQKEY = "TIMER_DEL_UNIQKEY"
# our extension (expected-version appends): the stream an event belongs to and its number in it
PROPERTY_STREAM_ID = "STREAM_ID"
PROPERTY_STREAM_VERSION = "STREAM_VERSION"
# ours: half messages of one local (database) transaction; a later one may take the next version of a stream
# that an earlier one of the same group holds, since they commit or roll back together
PROPERTY_STREAM_TX_GROUP = "STREAM_TX_GROUP"
# ours: in a multi-stream batch (header `streams`), the queue of one message when not the batch's; the broker
# removes it before storing
PROPERTY_BATCH_QUEUE_ID = "BATCH_QUEUE_ID"
NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
KEY_SEPARATOR = " "


# -- properties --------------------------------------------------------------------------------------
def properties_to_string(properties: dict[str, str]) -> str:
    """`MessageDecoder.messageProperties2String` as 5.2+ writes it: `k\\x01v\\x02` per entry, None dropped."""
    return "".join(f"{k}\x01{v}\x02" for k, v in properties.items() if v is not None)


def string_to_properties(s: str | None) -> dict[str, str]:
    """`MessageDecoder.string2messageProperties`: lenient, accepts a trailing separator or none."""
    out: dict[str, str] = {}
    if not s:
        return out
    for seg in s.split("\x02"):
        i = seg.find("\x01")
        if 0 < i < len(seg) - 1:
            out[seg[:i]] = seg[i + 1:]
    return out


def delete_property(properties_string: str, name: str) -> str:
    """Remove every `name` property from a properties string (`MessageUtils.deleteProperty`).

    As in Java the string is cut in place: each `name\\x01...` segment (starting the string or following a
    0x02) is dropped up to and including its closing 0x02 (or to the end); everything else, order,
    duplicates and separators included, is kept verbatim.
    """
    if not properties_string or name not in properties_string:
        return properties_string
    out = []
    lead = name + NAME_VALUE_SEPARATOR
    for seg in properties_string.split(PROPERTY_SEPARATOR):
        out.append(None if seg.startswith(lead) else seg)
    # Re-join: a dropped segment takes its closing separator with it.
    parts: list[str] = []
    last = len(out) - 1
    for i, seg in enumerate(out):
        if seg is None:
            continue
        parts.append(seg if i == last else seg + PROPERTY_SEPARATOR)
    return "".join(parts)


def delete_properties(properties_string: str, names: tuple[str, ...] | list[str]) -> str:
    """`delete_property` of each of `names`, in one pass over the string (the same result as deleting them
    one after the other: each cut drops whole `name\x01...\x02` segments and keeps everything else)."""
    if not properties_string:
        return properties_string
    leads = tuple(n + NAME_VALUE_SEPARATOR for n in names if n in properties_string)
    if not leads:
        return properties_string
    segs = properties_string.split(PROPERTY_SEPARATOR)
    last = len(segs) - 1
    parts = [seg if i == last else seg + PROPERTY_SEPARATOR for i, seg in enumerate(segs) if not seg.startswith(leads)]
    return "".join(parts)


def java_hashmap_order(keys: list[str], initial_capacity: int = 16) -> list[str]:
    """The iteration order of a Java `HashMap<String, ?>` filled with `keys` in this order.

    Default capacity 16, load factor 0.75: the table doubles whenever the size exceeds 0.75 x capacity;
    a key's bucket is `(h ^ (h >>> 16)) & (capacity - 1)` with h = `String.hashCode`. Iteration walks the
    buckets in order and each bucket in insertion order (a resize splits buckets preserving that order).
    Re-putting a key keeps its first position. Not modelled: bins treeified at 8+ colliding keys once
    the capacity reaches 64 (their order can differ).
    """
    seen: dict[str, None] = dict.fromkeys(keys)
    cap = 1
    while cap < max(initial_capacity, 1):
        cap <<= 1
    while len(seen) > cap * 3 // 4:
        cap <<= 1
    mask = cap - 1

    def bucket(k: str) -> int:
        h = java_string_hash(k) & _M32
        return (h ^ (h >> 16)) & mask

    return sorted(seen, key=bucket)  # sorted() is stable: insertion order within a bucket


def java_properties_string(properties: dict[str, str], initial_capacity: int = 16) -> str:
    """`messageProperties2String` of a Java `HashMap` built by putting `properties` in dict order (5.2+
    form: every entry ends with 0x02; None values are dropped)."""
    order = java_hashmap_order(list(properties), initial_capacity)
    return "".join(f"{k}\x01{properties[k]}\x02" for k in order if properties[k] is not None)


def get_property(props: str, name: str) -> str | None:
    """One property of a properties string, without parsing the rest."""
    marker = f"{name}{NAME_VALUE_SEPARATOR}"
    framed = PROPERTY_SEPARATOR + props
    i = framed.find(PROPERTY_SEPARATOR + marker)
    if i < 0:
        return None
    start = i + 1 + len(marker)
    end = framed.find(PROPERTY_SEPARATOR, start)
    return framed[start:] if end < 0 else framed[start:end]


def set_property(props: str, name: str, value: str) -> str:
    """`props` with `name` set to `value` (any previous value removed, the new one appended)."""
    props = delete_property(props, name)
    if props and not props.endswith(PROPERTY_SEPARATOR):
        props += PROPERTY_SEPARATOR
    return f"{props}{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
