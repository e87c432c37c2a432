"""POP consumption's shared vocabulary (RocketMQ 5's `ExtraInfoUtil`, `PopCheckPoint`, `AckMsg`, `KeyBuilder`,
`PopAckConstants`): the receipt handle a popped message carries (`POP_CK`), the checkpoint and ack records of
the revive topic, and the names of the revive and pop-retry topics."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field

from .native import native

CK_TAG = "ck"
ACK_TAG = "ack"
BATCH_ACK_TAG = "bAck"
REVIVE_GROUP = "CID_RMQ_SYS_REVIVE_GROUP"
REVIVE_QUEUE_NUM = 8
_dumps = json.JSONEncoder(separators=(",", ":")).encode  # compact, as `BatchAck.json_head` writes strings


def revive_topic(cluster: str) -> str:
    """`rmq_sys_REVIVE_LOG_<cluster>`."""
    return f"rmq_sys_REVIVE_LOG_{cluster}"


def pop_retry_topic(group: str, topic: str) -> str:
    """The V1 pop retry topic of a group and topic: `%RETRY%<group>_<topic>` (`KeyBuilder.buildPopRetryTopicV1`)."""
    return f"%RETRY%{group}_{topic}"


@dataclass(frozen=True)
class ExtraInfo:
    """A popped message's receipt handle (`POP_CK`): where its checkpoint is and which message it is."""

    ck_queue_offset: int
    pop_time: int
    invisible_time: int
    revive_qid: int
    retry: bool
    broker_name: str
    queue_id: int
    queue_offset: int

    def build(self) -> str:
        """`ExtraInfoUtil.buildExtraInfo`: space-separated fields, the retry flag as "1" / "0"."""
        return (f"{self.ck_queue_offset!s} {self.pop_time!s} {self.invisible_time!s} {self.revive_qid!s} "
                f"{'1' if self.retry else '0'} {self.broker_name!s} {self.queue_id!s} {self.queue_offset!s}")

    @classmethod
    def split(cls, text: str) -> ExtraInfo:
        """`ExtraInfoUtil.split`; ValueError for a handle that is not one."""
        parts = text.split(" ")
        if len(parts) < 8:
            raise ValueError(f"not a POP receipt handle (8 space-separated fields expected): {text!r}")
        try:
            return cls(int(parts[0]), int(parts[1]), int(parts[2]), int(parts[3]), parts[4] not in ("0", ""),
                       parts[5], int(parts[6]), int(parts[7]))
        except ValueError:
            raise ValueError(f"not a POP receipt handle: {text!r}") from None


@dataclass
class PopCheckPoint:
    """A pop's checkpoint record (`PopCheckPoint`, JSON keys so, pt, it, bm, n, q, t, c, ro, d, bn, rp):
    `num` messages of (topic, queue) from `start_offset` were popped by `group` at `pop_time`, invisible for
    `invisible_time`; `queue_offset_diff` are their offsets minus `start_offset`; `bit_map` marks the acked."""

    start_offset: int
    pop_time: int
    invisible_time: int
    num: int
    queue_id: int
    topic: str
    group: str
    broker_name: str
    queue_offset_diff: list[int] = field(default_factory=list)
    bit_map: int = 0
    revive_offset: int = 0
    re_put_times: int = 0

    @property
    def revive_time(self) -> int:
        return self.pop_time + self.invisible_time

    def offsets(self) -> list[int]:
        return [self.start_offset + d for d in self.queue_offset_diff]

    def to_json(self) -> str:
        return json.dumps({"so": self.start_offset, "pt": self.pop_time, "it": self.invisible_time,
                           "bm": self.bit_map, "n": self.num, "q": self.queue_id, "t": self.topic,
                           "c": self.group, "ro": self.revive_offset, "d": self.queue_offset_diff,
                           "bn": self.broker_name, "rp": self.re_put_times}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> PopCheckPoint:
        d = json.loads(text)
        return cls(int(d["so"]), int(d["pt"]), int(d["it"]), int(d["n"]), int(d["q"]), str(d["t"]), str(d["c"]),
                   str(d.get("bn", "")), [int(x) for x in d.get("d") or []], int(d.get("bm", 0)),
                   int(d.get("ro", 0)), int(d.get("rp", 0)))


@dataclass
class AckMsg:
    """An ack record (`AckMsg`, JSON keys ao, so, c, t, q, pt, bn): the message at `ack_offset` of the pop
    that started at `start_offset` at `pop_time` is settled."""

    ack_offset: int
    start_offset: int
    group: str
    topic: str
    queue_id: int
    pop_time: int
    broker_name: str = ""

    def to_json(self) -> str:
        return json.dumps({"ao": self.ack_offset, "so": self.start_offset, "c": self.group, "t": self.topic,
                           "q": self.queue_id, "pt": self.pop_time, "bn": self.broker_name}, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str | bytes) -> AckMsg:
        d = json.loads(text)
        return cls(int(d["ao"]), int(d["so"]), str(d["c"]), str(d["t"]), int(d["q"]), int(d["pt"]),
                   str(d.get("bn", "")))


def offsets_text_py(start: int, stop: int) -> str:
    """`",".join(map(str, range(start, stop)))`: consecutive queue offsets as POP's msgOffsetInfo and the
    checkpoint buffer's journal write them (the reference of `_native.offsets_text`)."""
    return ",".join(map(str, range(start, stop)))


def int_run_py(value: object) -> bool:
    """True when `value` is a non-empty list of 64-bit ints (exactly int: no bool, no float), each one more
    than the one before: then it is its own `sorted(set(map(int, value)))` (the reference of
    `_native.int_run`)."""
    if type(value) is not list or not value:
        return False
    first = value[0]
    return (all(type(x) is int for x in value) and -(2**63) <= first and first + len(value) <= 2**63
            and value == list(range(first, first + len(value))))


offsets_text = native.offsets_text if native is not None and hasattr(native, "offsets_text") else offsets_text_py
int_run = native.int_run if native is not None and hasattr(native, "int_run") else int_run_py


def bitset_indexes(value: object) -> list[int]:
    """The set bits of a `BatchAck`'s `b`: a list of indexes (what our client sends) or the base64 of Java's
    `BitSet.toByteArray()` (little-endian bytes)."""
    if isinstance(value, list):
        if int_run(value):  # consecutive ints already (a whole pop acked): sorted, no duplicates
            return value[:]
        return sorted(set(map(int, value)))
    if isinstance(value, str):
        raw = base64.b64decode(value)
        return [i * 8 + b for i, byte in enumerate(raw) for b in range(8) if byte >> b & 1]
    raise ValueError(f"a BatchAck bit set must be a list of indexes or base64 bytes, not {type(value).__name__}")


@dataclass
class BatchAck:
    """One entry of a BATCH_ACK_MESSAGE body (`BatchAck`, JSON keys c, t, r, so, q, rq, pt, it, b): the
    messages at `start_offset` + each bit of `bits` of one pop are settled."""

    group: str
    topic: str
    retry: bool
    start_offset: int
    queue_id: int
    revive_qid: int
    pop_time: int
    invisible_time: int
    bits: list[int]

    def to_dict(self) -> dict:
        return {"c": self.group, "t": self.topic, "r": "1" if self.retry else "0", "so": self.start_offset,
                "q": self.queue_id, "rq": self.revive_qid, "pt": self.pop_time, "it": self.invisible_time,
                "b": self.bits}

    @staticmethod
    def json_head(group: str, topic: str, retry: bool, start_offset: int, queue_id: int, revive_qid: int,
                  pop_time: int, invisible_time: int) -> str:
        """`to_dict()`'s compact JSON up to the bits' opening `[` (the same keys, order and values), for a
        client that writes a BATCH_ACK body as text: head + `bits_text(bits)` + `]}` is one entry."""
        return (f'{{"c":{_dumps(group)},"t":{_dumps(topic)},"r":"{1 if retry else 0}","so":{start_offset},'
                f'"q":{queue_id},"rq":{revive_qid},"pt":{pop_time},"it":{invisible_time},"b":[')

    @classmethod
    def from_dict(cls, d: dict) -> BatchAck:
        return cls(str(d["c"]), str(d["t"]), str(d.get("r", "0")) == "1", int(d["so"]), int(d["q"]), int(d["rq"]),
                   int(d["pt"]), int(d.get("it", 0)), bitset_indexes(d.get("b", [])))


def bits_text(bits: list[int]) -> str:
    """`",".join(map(str, bits))`; a run of consecutive ints (a whole pop acked) is written by the C loop."""
    return offsets_text(bits[0], bits[0] + len(bits)) if int_run(bits) else ",".join(map(str, bits))
