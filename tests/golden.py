"""Shared helpers for the golden-vector tests: locating `/work/shared/golden`, reading its files, and
rebuilding its inputs the way a broker would (queue offsets, physical offsets, mapped-file roll-over).

The golden directory sits next to the repository: `<repo>/../shared/golden` (else `$RMQ_SHARED_DIR` or
/work/shared, for a clone made elsewhere). A missing directory or file
makes the calling test FAIL (never skip): the vectors are the ground truth for byte compatibility.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

from rmq_eventstore.common import codec
from rmq_eventstore.common.message import Message


def _shared_dir() -> Path:
    """`<repo>/../shared` (beside the repository), else `$RMQ_SHARED_DIR`, else `/work/shared` (this machine's
    copy, for a clone made elsewhere, e.g. under /tmp); the first that exists, or the first when none does (the
    tests then fail naming it)."""
    beside = Path(__file__).resolve().parent.parent.parent / "shared"
    for candidate in (beside, Path(os.environ.get("RMQ_SHARED_DIR", "")), Path("/work/shared")):
        if str(candidate) not in ("", ".") and (candidate / "golden").is_dir():
            return candidate
    return beside


SHARED_DIR = _shared_dir()
GOLDEN_DIR = SHARED_DIR / "golden"
SPEC_DIR = SHARED_DIR / "spec"
COMMITLOG_2K_FILE_SIZE = 2048

# Placeholder parameter used when the golden data cannot be read at collection time: the test that
# receives it calls `golden_path`, which fails with the real reason.
MISSING = "golden-data-missing"


def golden_path(name: str) -> Path:
    """Path of a golden file; fails the test (not skip) with a clear message when it is absent."""
    if not GOLDEN_DIR.is_dir():
        pytest.fail(
            f"golden vectors directory {GOLDEN_DIR} is missing: it must hold the RocketMQ-generated "
            "files (cases.jsonl, store.bin, ...) described in its README.md", pytrace=False)
    p = GOLDEN_DIR / name
    if not p.exists():
        pytest.fail(f"golden file {p} is missing", pytrace=False)
    return p


@cache
def _read_bytes(name: str) -> bytes:
    return golden_path(name).read_bytes()


def read_bytes(name: str) -> bytes:
    return _read_bytes(name)


@cache
def _read_jsonl(name: str) -> tuple[dict, ...]:
    with golden_path(name).open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def read_jsonl(name: str) -> list[dict]:
    return [dict(d) for d in _read_jsonl(name)]


def params(name: str, id_key: str | None = "case") -> list:
    """pytest parameters (line indices, with ids) for the lines of a golden jsonl file.

    Evaluated at collection time; when the file cannot be read a single MISSING parameter is returned so
    that the test runs and fails with the reason instead of being silently skipped.
    """
    p = GOLDEN_DIR / name
    try:
        with p.open(encoding="utf-8") as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except OSError:
        return [pytest.param(MISSING, id=MISSING)]
    out = []
    for i, d in enumerate(lines):
        label = d.get(id_key) if id_key else None
        out.append(pytest.param(i, id=f"{i:02d}-{label}" if label else f"{i:02d}"))
    return out


def line(name: str, i) -> dict:
    """Line `i` of a golden jsonl file (fails the test when the data is missing)."""
    rows = read_jsonl(name)
    if i == MISSING:
        pytest.fail(f"golden file {GOLDEN_DIR / name} could not be read at collection time", pytrace=False)
    return rows[i]


# -- rebuilding the inputs --------------------------------------------------------------------------
def case_body(case: dict) -> bytes:
    if "bodyHex" in case:
        return bytes.fromhex(case["bodyHex"])
    return case.get("body", "").encode("utf-8")


def case_keys(case: dict) -> str | None:
    k = case.get("keys")
    if k is None:
        return None
    return k if isinstance(k, str) else " ".join(k)


def case_properties_string(case: dict) -> str:
    """The stored properties: `propertiesString` verbatim, else what a producer builds from tags/keys."""
    if "propertiesString" in case:
        return case["propertiesString"]
    return codec.build_properties_string(
        Message(topic=case["topic"], tags=case.get("tags"), keys=case.get("keys")))


def takes_queue_offset(sys_flag: int) -> bool:
    """Only non-transactional and COMMIT records take (and advance) a queue offset."""
    return codec.transaction_value(sys_flag) in (codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_COMMIT_TYPE)


@dataclass
class Built:
    case: dict
    record: bytes
    queue_offset: int
    physical_offset: int


class QueueOffsets:
    """Per topic-queue logical offsets as the broker's QueueOffsetOperator assigns them."""

    def __init__(self) -> None:
        self._next: dict[tuple[str, int], int] = {}

    def assign(self, topic: str, queue_id: int, sys_flag: int) -> int:
        if not takes_queue_offset(sys_flag):
            return 0
        key = (topic, queue_id)
        off = self._next.get(key, 0)
        self._next[key] = off + 1
        return off


def encode_case(case: dict, queue_offset: int, physical_offset: int, append_crc: bool = False) -> bytes:
    return bytes(codec.encode_record(
        topic=case["topic"], body=case_body(case), properties_string=case_properties_string(case),
        queue_id=case.get("queueId", 0), flag=case.get("flag", 0), queue_offset=queue_offset,
        physical_offset=physical_offset, sys_flag=case.get("sysFlag", 0),
        born_timestamp=case.get("bornTimestamp", 0), born_host=codec.parse_host(case["bornHost"]),
        store_timestamp=case.get("storeTimestamp", 0), store_host=codec.parse_host(case["storeHost"]),
        reconsume_times=case.get("reconsumeTimes", 0),
        prepared_transaction_offset=case.get("preparedTransactionOffset", 0),
        force_v2=case.get("version") == "V2", append_crc=append_crc,
    ))


def build_store(cases: list[dict], append_crc: bool = False) -> list[Built]:
    """Encode the cases back to back from physical offset 0, as one commitlog stream."""
    qo = QueueOffsets()
    out: list[Built] = []
    phys = 0
    for c in cases:
        q = qo.assign(c["topic"], c.get("queueId", 0), c.get("sysFlag", 0))
        rec = encode_case(c, q, phys, append_crc)
        out.append(Built(c, rec, q, phys))
        phys += len(rec)
    return out


def build_mapped_files(cases: list[dict], file_size: int) -> tuple[dict[int, bytes], list]:
    """Encode the cases into fixed-size files the way `doAppend` does: a record that would end closer
    than 8 bytes to the end of its file is preceded by a BLANK and goes to the next file.

    Returns ({file start offset: file bytes}, [(kind, physical offset, case or blank size)]).
    """
    files: dict[int, bytearray] = {0: bytearray(file_size)}
    start, wrote = 0, 0
    log: list = []
    qo = QueueOffsets()
    for c in cases:
        # The record length does not depend on the offsets, so measure it with zeros first.
        length = len(encode_case(c, 0, 0))
        max_blank = file_size - wrote
        if length + codec.END_FILE_MIN_BLANK_LENGTH > max_blank:
            files[start][wrote:wrote + 8] = codec.encode_blank(max_blank)
            log.append(("blank", start + wrote, max_blank))
            start += file_size
            wrote = 0
            files[start] = bytearray(file_size)
        q = qo.assign(c["topic"], c.get("queueId", 0), c.get("sysFlag", 0))
        rec = encode_case(c, q, start + wrote)
        files[start][wrote:wrote + len(rec)] = rec
        log.append(("msg", start + wrote, c))
        wrote += len(rec)
    return {k: bytes(v) for k, v in files.items()}, log


# -- the Java decoder's view of a record ------------------------------------------------------------
def body_text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def decoded_view(buf: bytes, pos: int, *, client: bool = False) -> dict:
    """The fields of one record in the shape of the golden `*.decoded.jsonl` lines, computed only with
    the codec: `decode_message` (decompressed view and stored view) and `check_message_and_return_size`.
    """
    m = codec.decode_message(buf, pos, check_crc=True, decompress=True)
    raw = codec.decode_message(buf, pos, check_crc=True, decompress=False)
    chk = codec.check_message_and_return_size(buf, pos, check_crc=True)
    assert chk.success and chk.size == m.store_size, chk
    req = chk.request
    body = bytes(m.body)
    d = {
        "offsetInFile": pos,
        "storeSize": m.store_size,
        "magicCode": m.magic_code,
        "magicHex": f"{m.magic_code & 0xFFFFFFFF:08x}",
        "version": m.version,
        "bodyCRC": m.body_crc,
        "queueId": m.queue_id,
        "flag": m.flag,
        "queueOffset": m.queue_offset,
        "commitLogOffset": m.commit_log_offset,
        "sysFlag": m.sys_flag,
        "storedSysFlag": raw.sys_flag,
        "storedBodyLength": len(raw.body),
        "bornTimestamp": m.born_timestamp,
        "bornHost": m.born_host,
        "storeTimestamp": m.store_timestamp,
        "storeHost": m.store_host,
        "reconsumeTimes": m.reconsume_times,
        "preparedTransactionOffset": m.prepared_transaction_offset,
        "topic": m.topic,
        "bodyLength": len(body),
        # Java's MessageDecoder sets the body only when BODYLEN > 0, so an empty body decodes as null.
        "body": body_text(body) if len(raw.body) else None,
        "bodyHex": body.hex(),
        "bodyCRCComputed": codec.body_crc(body),
        "propertiesString": m.properties_string,
        "properties": m.properties,
        "tags": m.tags,
        "tagsCode": req.tags_code,
        "keys": req.keys,
        "msgId": m.client_msg_id if client else m.msg_id,
        "uniqKey": req.uniq_key,
    }
    if client:
        d["offsetMsgId"] = m.offset_msg_id
    # The dispatch request must agree with the full decode.
    assert (req.topic, req.queue_id, req.commit_log_offset, req.consume_queue_offset, req.store_timestamp,
            req.sys_flag, req.prepared_transaction_offset, req.properties_string) == (
        m.topic, m.queue_id, m.commit_log_offset, m.queue_offset, m.store_timestamp, raw.sys_flag,
        m.prepared_transaction_offset, m.properties_string)
    assert m.tags_code == req.tags_code and m.keys == req.keys and m.uniq_key == req.uniq_key
    return d


def walk_file(buf: bytes) -> tuple[list[dict], int]:
    """Decode every record of one file with `iter_records`: (views incl. BLANK lines, stoppedAt)."""
    views: list[dict] = []
    stopped = len(buf)
    for pos, r in codec.iter_records(buf, 0, check_crc=True):
        if r.success and r.size == 0:
            size, _magic = codec.read_size_magic(buf, pos)
            views.append({"offsetInFile": pos, "blank": True, "totalSize": size})
            stopped = pos + size
            break
        if not r.success:
            stopped = pos
            break
        views.append(decoded_view(buf, pos))
    return views, stopped


def diff_fields(got: dict, want: dict) -> list[str]:
    """Human-readable differences between a computed view and a golden line (all keys compared)."""
    out = []
    for k in sorted(set(got) | set(want)):
        if k not in got:
            out.append(f"{k}: missing from the codec's view (golden {want[k]!r})")
        elif k not in want:
            out.append(f"{k}: not in the golden line (codec {got[k]!r})")
        elif got[k] != want[k]:
            g, w = repr(got[k]), repr(want[k])
            out.append(f"{k}: codec {g[:200]} != golden {w[:200]}")
    return out
