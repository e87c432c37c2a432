"""CommitLog: the append-only log of every message, in RocketMQ's segment files (spec §1, §5, §9.3).

Puts encode outside the put lock and, inside it, take queue offsets, the physical offset and the store
time, patch them into the record and copy it into the current segment. A record that would end closer
than 8 bytes to the end of a segment is not split: a BLANK record closes the segment and the record goes
to the next one (`DefaultAppendMessageCallback`).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..common import codec
from ..common.codec import DispatchRequest, EncodeError, PreparedRecord, RecordEncoder, UniqueIdGenerator
from ..common.message import Message, MessageExt
from ..common.properties import get_property
from ..common.status import AppendMessageStatus, PutMessageStatus
from ..common.topic import TopicValidationError, validate_topic
from .config import FlushDiskType, StoreConfig, parse_delay_levels
from .mapped_file import MappedFile, MappedFileQueue

if TYPE_CHECKING:
    from .flush import GroupCommitService

log = logging.getLogger(__name__)

_INT = codec._INT
_tuple_new = tuple.__new__


def now_ms() -> int:
    return int(time.time() * 1000)


_now_ms = now_ms  # the real clock (a test may replace the module's now_ms; single puts then take Python)
_SYNC_FLUSH = FlushDiskType.SYNC_FLUSH


@dataclass(slots=True)
class AppendMessageResult:
    """Where an append landed (`AppendMessageResult`): first physical offset, bytes, queue offset."""

    status: AppendMessageStatus
    wrote_offset: int = 0
    wrote_bytes: int = 0
    store_timestamp: int = 0
    logics_offset: int = 0
    msg_num: int = 1
    page_cache_rt: int = 0
    store_host: bytes = b""
    store_port: int = 0
    offsets: list[int] = field(default_factory=list)
    uniq_keys: list[str | None] = field(default_factory=list)

    @property
    def msg_id(self) -> str:
        """offsetMsgId of the message (comma-joined for a batch, as RocketMQ returns it)."""
        return ",".join(self.msg_ids)

    @property
    def msg_ids(self) -> list[str]:
        offs = self.offsets or ([self.wrote_offset] if self.status == AppendMessageStatus.PUT_OK else [])
        return [codec.create_message_id(self.store_host, self.store_port, o) for o in offs]

    def is_ok(self) -> bool:
        return self.status == AppendMessageStatus.PUT_OK


@dataclass(slots=True)
class PutMessageResult:
    """Outcome of a put (`PutMessageResult`): a status, and the append result when bytes were written."""

    status: PutMessageStatus
    append_result: AppendMessageResult | None = None
    reason: str = ""

    def is_ok(self) -> bool:
        """True when the record was written (even if a later flush timed out), as RocketMQ's isOk."""
        return self.append_result is not None and self.append_result.is_ok()

    def __repr__(self) -> str:
        a = self.append_result
        where = f", wrote_offset={a.wrote_offset}, logics_offset={a.logics_offset}" if a else ""
        why = f", reason={self.reason!r}" if self.reason else ""
        return f"PutMessageResult({self.status.name}{where}{why})"


# The single put's locked body in C, which builds the two results above without running their __init__
# (None: the pure-Python loops, or an extension built before it existed).
_native_append_one = getattr(codec.native, "append_one", None)
# The network single put's locked body in C (a message with a properties string: what the broker stores for a
# SEND_MESSAGE), or None (the pure-Python reference `_append_one_net_py`, or an older extension).
_native_append_one_net = getattr(codec.native, "append_one_net", None) if _native_append_one is not None else None
_native_uniq = getattr(codec.native, "uniq_create", None)  # UniqueIdGenerator.create's fast path, or None
# put_message's whole native path in one call (UNIQ_KEY, put lock, append_one / append_one_net, flush wake-up),
# or None (the pure-Python loops, or an extension built before it existed)
native_put_one = getattr(codec.native, "put_one", None) if _native_append_one_net is not None else None
if _native_append_one is not None:
    from . import reput as _reput  # the hand-off append_one does itself when on_appended is notify_appended

    codec.native.single_init(AppendMessageResult, PutMessageResult, AppendMessageStatus.PUT_OK,
                             PutMessageStatus.PUT_OK, _reput.ReputMessageService.notify_appended, _reput.MAX_PENDING)


_INT32_FIELDS = ("queue_id", "flag", "sys_flag", "reconsume_times")
_INT64_FIELDS = ("born_timestamp", "prepared_transaction_offset")


def _diagnose(msg: Message) -> str:
    """Which field of a message cannot be stored (for a clear MESSAGE_ILLEGAL reason)."""
    for name, bits in [(f, 32) for f in _INT32_FIELDS] + [(f, 64) for f in _INT64_FIELDS]:
        v = getattr(msg, name)
        if not isinstance(v, int):
            return f"{name} must be an int, not {type(v).__name__}"
        if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
            return f"{name}={v} does not fit a signed {bits}-bit field"
    if not isinstance(msg.body, (bytes, bytearray, memoryview)):
        return f"body must be bytes, not {type(msg.body).__name__}"
    for name in ("tags", "properties_string", "uniq_key", "born_host"):
        v = getattr(msg, name)
        if v is not None and not isinstance(v, str):
            return f"{name} must be a str, not {type(v).__name__}"
    return ""


def _wait_store_msg_ok(msg: Message) -> bool:
    """`Message.isWaitStoreMsgOK`: the WAIT property, true unless set to something other than "true"."""
    props = msg.properties
    if props:
        v = props.get(codec.PROPERTY_WAIT_STORE_MSG_OK)
        if v is not None:
            return v.lower() == "true"
    s = msg.properties_string
    if s and "WAIT\x01" in s:
        if s.count("WAIT\x01") == 1:  # one candidate (a producer's usual WAIT=true): read it, parse nothing else
            v = get_property(s, codec.PROPERTY_WAIT_STORE_MSG_OK) or None  # empty: absent, as the parse
        else:
            v = codec.string_to_properties(s).get(codec.PROPERTY_WAIT_STORE_MSG_OK)
        if v is not None:
            return v.lower() == "true"
    return True


def _illegal(reason: str, status: PutMessageStatus = PutMessageStatus.MESSAGE_ILLEGAL) -> PutMessageResult:
    return PutMessageResult(status, None, reason)


class CommitLog:
    """The commitlog directory: a MappedFileQueue, the put lock and the queue-offset table.

    `on_appended(start, end, requests)` receives, under the put lock and in log order, the dispatch
    requests of what was just written (a list of `DispatchRequest`, or one `DispatchColumns` from a
    native batch put), so the reput service need not parse back records this process encoded itself.
    """

    # the fields the native single put reads and writes are slots (by offset, not by attribute look-up:
    # `_native`'s SLOT FIELDS); everything else lives in the instance dict as before
    __slots__ = ("mapped_file_queue", "topic_queue_table", "begin_time_in_lock", "on_appended", "__dict__",
                 "__weakref__")

    def __init__(self, config: StoreConfig, read_only: bool = False) -> None:
        self.config = config
        self.read_only = read_only
        self.mapped_file_queue = MappedFileQueue(config.commit_log_path, config.mapped_file_size_commit_log,
                                                 read_only=read_only)
        self.file_size = config.mapped_file_size_commit_log
        self.uniq_ids = UniqueIdGenerator()
        self.encoder = RecordEncoder(
            config.store_host, config.max_message_size, config.auto_message_version_on_topic_len,
            config.enabled_append_prop_crc, self.uniq_ids, parse_delay_levels(config.message_delay_level))
        self.store_host_bytes, self.store_port = self.encoder.store_host
        self.put_lock = threading.Lock()
        self.flush_lock = threading.Lock()
        # QueueOffsetOperator's topicQueueTable: "topic-queueId" -> next queue offset
        self.topic_queue_table: dict[str, int] = {}
        self.begin_time_in_lock = 0
        self.confirm_offset = 0
        self.on_appended: Callable[[int, int, list], None] | None = None
        self.on_new_queue: Callable[[str, int], None] | None = None
        self.writeable = True
        self._valid_topics: set[str] = set()
        # Flush services (flush.py), attached by MessageStore.start: SYNC_FLUSH puts wait on the group
        # commit service; ASYNC_FLUSH puts wake the commit (transient pool) or flush service.
        self.group_commit_service: GroupCommitService | None = None
        self.flush_wakeup: Callable[[], None] | None = None
        self.on_committed: Callable[[], None] | None = None

    # -- load / recovery ------------------------------------------------------------------------
    def load(self) -> bool:
        return self.mapped_file_queue.load()

    def recover_normally(self, check_crc: bool) -> int:
        """Find the end of valid data scanning the last three files (`recoverNormally`); truncate after it.

        Returns the recovered end offset (processOffset).
        """
        mfq = self.mapped_file_queue
        files = mfq.mapped_files
        if not files:
            mfq.flushed_where = mfq.committed_where = 0
            return 0
        index = max(0, len(files) - 3)
        process_offset = files[index].file_from_offset
        while index < len(files):
            mf = files[index]
            buf = mf.view
            pos = 0
            limit = mf.mapped_size
            blank = False
            while pos < limit:
                r = codec.check_message_and_return_size(buf, pos, check_crc, limit,
                                                        verify_prop_crc=self.config.force_verify_prop_crc)
                if r.success and r.size > 0:
                    pos += r.size
                    continue
                if r.success:  # BLANK: the rest of this file is unused
                    blank = True
                else:
                    if r.size > 0:
                        log.warning("half message at %d (%s): truncating", mf.file_from_offset + pos, r.reason)
                break
            process_offset = mf.file_from_offset + pos
            if blank and index + 1 < len(files):
                index += 1
                process_offset = files[index].file_from_offset
                continue
            if pos >= limit and index + 1 < len(files):
                index += 1
                continue
            break
        mfq.flushed_where = mfq.committed_where = process_offset
        mfq.truncate_dirty_files(process_offset)
        self.confirm_offset = process_offset
        return process_offset

    def abnormal_recover_start_offset(self, min_timestamp: int) -> int:
        """Where abnormal recovery re-dispatches from (`isMappedFileMatchedRecover`, spec §9.4).

        The newest file whose first record is a message stored at or before `min_timestamp` (the
        checkpoint's proof that everything up to then reached the queues and index); the first file when
        none qualifies.
        """
        files = self.mapped_file_queue.mapped_files
        for mf in reversed(files):
            buf = mf.view
            if mf.mapped_size < 64:
                continue
            magic = _INT.unpack_from(buf, 4)[0]
            if magic not in (codec.MESSAGE_MAGIC_CODE, codec.MESSAGE_MAGIC_CODE_V2):
                continue
            sys_flag = _INT.unpack_from(buf, codec.SYSFLAG_POSITION)[0]
            ts = codec._LONG.unpack_from(buf, codec.store_timestamp_position(sys_flag))[0]
            if ts != 0 and ts <= min_timestamp:
                return mf.file_from_offset
        return files[0].file_from_offset if files else 0

    # -- put ------------------------------------------------------------------------------------
    def _check(self, msg: Message) -> PutMessageResult | None:
        if not self.writeable or self.read_only:
            return _illegal("the store is not writeable", PutMessageStatus.SERVICE_NOT_AVAILABLE)
        topic = msg.topic
        if topic not in self._valid_topics:
            try:
                validate_topic(topic)
            except TopicValidationError as e:
                return _illegal(str(e))
            except TypeError:
                return _illegal(f"topic must be a str, not {type(topic).__name__}")
            if len(self._valid_topics) < 100_000:
                self._valid_topics.add(topic)
        if msg.queue_id < 0:
            return _illegal(f"queue id {msg.queue_id} is negative")
        return None

    def _prepare(self, msg: Message, uniq_key: str | None, born: int = 0) -> PreparedRecord | PutMessageResult:
        bad = self._check(msg)
        if bad is not None:
            return bad
        try:
            return self.encoder.prepare(msg, uniq_key, born)
        except EncodeError as e:
            return _illegal(str(e), PutMessageStatus[e.status])
        except (ValueError, TypeError, AttributeError, struct.error) as e:
            # a field out of its int32/int64 range, bad born host text, a body that is not bytes
            return _illegal(f"cannot encode message: {_diagnose(msg) or e}")

    def _uniq_keys(self, msgs: Sequence[Message]) -> list[str | None] | None:
        if not self.config.auto_create_uniq_key:
            return None
        need = codec.native.count_missing_uniq(msgs) if codec.native is not None else None
        if need is None:
            need = sum(1 for m in msgs if m.uniq_key is None and m.properties_string is None)
        if not need:
            return None
        if need == len(msgs):
            return self.uniq_ids.create_many(need)  # every message gets one: the ids are the list
        ids = iter(self.uniq_ids.create_many(need))
        return [next(ids) if m.uniq_key is None and m.properties_string is None else None for m in msgs]

    def put_message(self, msg: Message) -> PutMessageResult:
        put_one = native_put_one
        cfg = self.config
        if (put_one is not None and self.writeable and not self.read_only and cfg.flush_disk_type is not _SYNC_FLUSH
                and now_ms is _now_ms):  # the native path below in one call (_native.put_one)
            fast = put_one(self, msg, self.uniq_ids if cfg.auto_create_uniq_key else None, self.encoder,
                           self.put_lock, self.file_size, self.flush_wakeup)
            if fast is not None:
                return fast if fast.__class__ is not tuple else self.put_declined(msg, fast[0])
        uniq = None
        if msg.uniq_key is None and msg.properties_string is None and self.config.auto_create_uniq_key:
            uniq = (_native_uniq is not None and _native_uniq(self.uniq_ids)) or self.uniq_ids.create()
        if self.writeable and not self.read_only:
            append_one = _native_append_one
            if append_one is not None and now_ms is _now_ms:  # _append_one's native path, without its frame
                if msg.properties_string is None or _native_append_one_net is None:
                    with self.put_lock:
                        fast = append_one(self, msg, uniq, self.encoder._plain_ctx or self.encoder.plain_context(),
                                          self.file_size)
                else:  # what a producer sent (the broker's SEND_MESSAGE): a properties string, no uniq to add
                    with self.put_lock:
                        fast = _native_append_one_net(self, msg, self.encoder._net_ctx or self.encoder.network_context(),
                                                      self.file_size)
                if fast is not None:
                    if self.config.flush_disk_type is _SYNC_FLUSH:
                        return self._finish(fast.append_result, _wait_store_msg_ok(msg))  # type: ignore[arg-type]
                    wake = self.flush_wakeup
                    if wake is not None:
                        wake()
                    return fast
            else:
                fast = self._append_one(msg, uniq)
                if fast is not None:
                    return fast
            return self.put_declined(msg, uniq)
        rec = self._prepare(msg, uniq)
        if isinstance(rec, PutMessageResult):
            return rec
        return self._append([rec], rec.total, _wait_store_msg_ok(msg))

    def put_declined(self, msg: Message, uniq: str | None) -> PutMessageResult:
        """The rest of `put_message` once its fast paths declined (a file to roll, a new queue, a message
        they do not encode, ...) having drawn `uniq`, the message's UNIQ_KEY: the general path."""
        fast = self._append_plain((msg,), (uniq,), _wait_store_msg_ok(msg))
        if fast is not None:
            return fast
        rec = self._prepare(msg, uniq)
        if isinstance(rec, PutMessageResult):
            return rec
        return self._append([rec], rec.total, _wait_store_msg_ok(msg))

    def put_messages(self, msgs: Sequence[Message]) -> PutMessageResult:
        """Append a batch under one lock into one file: consecutive queue offsets per queue."""
        if not msgs:
            return _illegal("empty batch")
        if not self.writeable or self.read_only:
            return _illegal("the store is not writeable", PutMessageStatus.SERVICE_NOT_AVAILABLE)
        uniq = self._uniq_keys(msgs)
        wait = _wait_store_msg_ok(msgs[0])  # a batch waits as its first message says (MessageBatch)
        fast = self._append_plain(msgs, uniq, wait)
        if fast is not None:
            return fast
        prepare = self.encoder.prepare
        valid = self._valid_topics
        recs = []
        total = 0
        born = now_ms()
        i = 0
        try:
            for i, m in enumerate(msgs):
                if m.topic not in valid or m.queue_id < 0 or m.sys_flag & codec.TRANSACTION_PREPARED_TYPE:
                    if m.sys_flag & codec.TRANSACTION_PREPARED_TYPE:  # PREPARED or ROLLBACK
                        return _illegal(f"message {i} of the batch: a batch may not hold transactional "
                                        "(prepared/rollback) messages")
                    bad = self._check(m)
                    if bad is not None:
                        bad.reason = f"message {i} of the batch: {bad.reason}"
                        return bad
                r = prepare(m, uniq[i] if uniq is not None else None, born)
                recs.append(r)
                total += r.total
        except EncodeError as e:
            return _illegal(f"message {i} of the batch: {e}", PutMessageStatus[e.status])
        except (ValueError, TypeError, AttributeError, struct.error) as e:
            return _illegal(f"message {i} of the batch: cannot encode message: {_diagnose(msgs[i]) or e}")
        return self._append(recs, total, wait)

    def _file_for(self, total: int) -> tuple[MappedFile, int]:
        """Under the put lock: the file and position `total` bytes go to. When they would end closer than
        8 bytes to the end of the current file, a BLANK record closes it (END_OF_FILE) and a new file
        is started. Raises OSError when no file can be created."""
        mfq = self.mapped_file_queue
        mf = mfq.get_last_mapped_file(0)
        pos = mf.wrote_position
        max_blank = self.file_size - pos
        if total + codec.END_FILE_MIN_BLANK_LENGTH > max_blank:
            mf.write_at(pos, codec.encode_blank(max_blank))
            mf.wrote_position = self.file_size
            blank_at = mf.file_from_offset + pos
            if self.on_appended is not None:
                self.on_appended(blank_at, blank_at + max_blank, [])
            mf = mfq.get_last_mapped_file(0)
            pos = mf.wrote_position
        return mf, pos

    def _finish(self, result: AppendMessageResult, wait: bool = True) -> PutMessageResult:
        """After the lock (`handleDiskFlush`): under SYNC_FLUSH wait until the appended bytes are on disk,
        sharing the flush with concurrent puts through the group commit service; under ASYNC_FLUSH wake
        the commit / flush service. A message whose WAIT property is false only wakes the service."""
        status = PutMessageStatus.PUT_OK
        if self.config.flush_disk_type == FlushDiskType.SYNC_FLUSH:
            next_offset = result.wrote_offset + result.wrote_bytes
            svc = self.group_commit_service
            if not wait:
                if svc is not None:
                    svc.wakeup()
            elif svc is not None:
                status = svc.submit_and_wait(next_offset, self.config.sync_flush_timeout)
            elif not self.flush_until(next_offset, self.config.sync_flush_timeout):
                status = PutMessageStatus.FLUSH_DISK_TIMEOUT
        else:
            wake = self.flush_wakeup
            if wake is not None:
                wake()
        return PutMessageResult(status, result)

    def _encode_plain_columns(self, msgs: Sequence[Message], uniq: list[str | None] | None, table: dict[str, int],
                              base: int, begin: int) -> codec.PlainBatch | None:
        return self.encoder.encode_plain_batch(msgs, uniq, table, base, begin, True)

    def _encode_network_batch(self, msgs: Sequence[Message], _uniq: list[str | None] | None,
                              table: dict[str, int], base: int, begin: int) -> codec.PlainBatch | None:
        return self.encoder.encode_network_batch(msgs, table, base, begin)

    def _append_plain(self, msgs: Sequence[Message], uniq: list[str | None] | None,
                      wait: bool = True) -> PutMessageResult | None:
        """The batch fast path (`RecordEncoder.encode_plain_batch`, else `encode_network_batch` for
        messages with a properties string): encoded under the lock in one pass,
        as the offsets are only known there. None when the batch needs the general path."""
        with self.put_lock:
            begin = now_ms()
            self.begin_time_in_lock = begin
            try:
                # Where the batch would land, without creating a file yet (a refused batch creates nothing).
                last = self.mapped_file_queue.get_last_mapped_file_or_none()
                if last is None:
                    base = 0
                elif last.is_full():
                    base = last.file_from_offset + self.file_size
                else:
                    base = last.file_from_offset + last.wrote_position
                table = self.topic_queue_table
                encode = self._encode_plain_columns
                try:
                    batch = encode(msgs, uniq, table, base, begin)
                    if batch is None:  # messages from the network carry a properties string
                        encode = self._encode_network_batch
                        batch = encode(msgs, uniq, table, base, begin)
                except (struct.error, TypeError, AttributeError, ValueError):
                    batch = None  # a field out of range, a wrong type: the general path explains it
                if batch is None:
                    return None
                total = len(batch.data)
                if total + codec.END_FILE_MIN_BLANK_LENGTH > self.file_size:
                    return None  # the general path reports it
                mf, pos = self._file_for(total)
                if mf.file_from_offset + pos != base:  # rolled to a new file: encode for where it lands
                    base = mf.file_from_offset + pos
                    batch = encode(msgs, uniq, table, base, begin)
                    assert batch is not None
            except OSError as e:
                return _illegal(f"cannot create a commitlog file: {e}", PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
            finally:
                self.begin_time_in_lock = 0
            mf.append_message(batch.data)
            mf.store_timestamp = begin
            for key, nxt in batch.queue_offsets.items():
                if key not in table and self.on_new_queue is not None:
                    topic, _, qid = key.rpartition("-")
                    self.on_new_queue(topic, int(qid))
                table[key] = nxt
            if self.on_appended is not None:
                self.on_appended(base, base + total, batch.requests)
        return self._finish(AppendMessageResult(
            AppendMessageStatus.PUT_OK, base, total, begin, batch.first_queue_offset, len(msgs),
            now_ms() - begin, self.store_host_bytes, self.store_port, batch.offsets, batch.uniq_keys), wait)

    def _append_one(self, msg: Message, uniq: str | None) -> PutMessageResult | None:
        """`put_message`'s fast path: `_append_plain` for one plain message in the common case only (the
        current file has room for it, its queue exists), the record encoded straight into the mapped file;
        None, having changed nothing, for anything else, which `_append_plain` then handles. The same
        bytes, hand-off and result. The locked body and the result objects are one C call
        (`_native.append_one`) when the native core is active, else `_append_one_py`, its reference (also
        taken while a test replaces `now_ms`)."""
        append_one = _native_append_one
        net = msg.properties_string is not None
        if append_one is not None and now_ms is _now_ms and not (net and _native_append_one_net is None):
            with self.put_lock:
                if net:
                    res = _native_append_one_net(self, msg, self.encoder.network_context(), self.file_size)
                else:
                    res = append_one(self, msg, uniq, self.encoder.plain_context(), self.file_size)
            if res is None:
                return None
        else:
            r = self._append_one_net_py(msg) if net else self._append_one_py(msg, uniq)
            if r is None:
                return None
            base, total, begin, q, req = r
            res = PutMessageResult(PutMessageStatus.PUT_OK, AppendMessageResult(
                AppendMessageStatus.PUT_OK, base, total, begin, q, 1, now_ms() - begin,
                self.store_host_bytes, self.store_port, [base], [req.uniq_key]))
        if self.config.flush_disk_type is _SYNC_FLUSH:
            return self._finish(res.append_result, _wait_store_msg_ok(msg))  # type: ignore[arg-type]
        wake = self.flush_wakeup
        if wake is not None:
            wake()
        return res

    def _append_one_py(self, msg: Message, uniq: str | None) -> tuple[int, int, int, int, DispatchRequest] | None:
        """`_native.append_one`'s reference, taking the put lock: (base, total, store time, queue offset,
        request) of the record written, or None, having changed nothing."""
        def write(mf: MappedFile, pos: int, room: int, q: int, base: int, begin: int) -> tuple[int, DispatchRequest] | None:
            # written in place when it fits before the file's end (else the general path rolls the file)
            return self.encoder.encode_plain_one_into(msg, uniq, q, base, begin, mf._write_view, pos, room)

        return self._append_one_locked(msg, write)

    def _append_one_net_py(self, msg: Message) -> tuple[int, int, int, int, DispatchRequest] | None:
        """`_native.append_one_net`'s reference, taking the put lock: a message with a properties string
        (what a producer sent) encoded by `encode_network_batch_py` straight into the current file, when
        that file has room for it and its queue exists. (base, total, store time, queue offset, request)
        of the record written, or None, having changed nothing (`_append_plain` then decides)."""
        def write(mf: MappedFile, pos: int, room: int, q: int, base: int, begin: int) -> tuple[int, DispatchRequest] | None:
            batch = self.encoder.encode_network_batch_py((msg,), self.topic_queue_table, base, begin)
            if batch is None or len(batch.data) > room:
                return None
            mf.write_at(pos, batch.data)
            return len(batch.data), batch.requests[0]

        return self._append_one_locked(msg, write)

    def _append_one_locked(self, msg: Message, write: Callable[..., tuple[int, DispatchRequest] | None]
                           ) -> tuple[int, int, int, int, DispatchRequest] | None:
        """The locked body both single-put references share: the current file must have room and the
        message's queue must exist (else None: a new queue, announced by on_new_queue, or a file to roll
        are the general path's); `write(file, pos, room, queue offset, base, store time)` puts the record
        at `pos` and returns (total, request), or None having written nothing; then the file position, the
        queue table and the hand-off, as the general path does."""
        with self.put_lock:
            files = self.mapped_file_queue.mapped_files
            if not files:
                return None
            mf = files[-1]
            pos = mf.wrote_position
            room = self.file_size - pos
            if room <= codec.END_FILE_MIN_BLANK_LENGTH:
                return None
            table = self.topic_queue_table
            key = f"{msg.topic}-{msg.queue_id}"
            q = table.get(key)
            if q is None:
                return None
            begin = now_ms()
            self.begin_time_in_lock = begin
            base = mf.file_from_offset + pos
            try:
                rec = write(mf, pos, room - codec.END_FILE_MIN_BLANK_LENGTH, q, base, begin)
            except (struct.error, TypeError, AttributeError, ValueError):
                rec = None  # the general path explains it
            if rec is None:
                self.begin_time_in_lock = 0
                return None
            total, req = rec
            mf.wrote_position = pos + total
            mf.store_timestamp = begin
            table[key] = q + 1
            cb = self.on_appended
            if cb is not None:
                cb(base, base + total, (req,))
            self.begin_time_in_lock = 0
        return base, total, begin, q, req

    def _append(self, recs: list[PreparedRecord], total: int, wait: bool = True) -> PutMessageResult:
        if total + codec.END_FILE_MIN_BLANK_LENGTH > self.file_size:
            return _illegal(f"{total} bytes do not fit in a {self.file_size}-byte commitlog file")
        emit = RecordEncoder.emit
        with self.put_lock:
            begin = now_ms()
            self.begin_time_in_lock = begin
            try:
                mf, pos = self._file_for(total)
            except OSError as e:
                self.begin_time_in_lock = 0
                return _illegal(f"cannot create a commitlog file: {e}", PutMessageStatus.CREATE_MAPPED_FILE_FAILED)
            base = mf.file_from_offset + pos
            table = self.topic_queue_table
            phys = base
            offsets = []
            parts: list = []
            dispatched: list = []
            first_qoff = -1
            ts_bytes = codec.encode_store_timestamp(begin)
            new_request = _tuple_new
            for rec in recs:
                tx = rec.sys_flag & codec.TRANSACTION_ROLLBACK_TYPE
                if tx == 0 or tx == codec.TRANSACTION_COMMIT_TYPE:
                    key = f"{rec.topic}-{rec.queue_id}"
                    qoff = table.get(key)
                    if qoff is None:
                        qoff = 0
                        if self.on_new_queue is not None:
                            self.on_new_queue(rec.topic, rec.queue_id)
                    table[key] = qoff + 1
                else:
                    qoff = 0
                if first_qoff < 0:
                    first_qoff = qoff
                emit(rec, qoff, phys, ts_bytes, parts)
                offsets.append(phys)
                code = rec.tags_code if rec.topic != codec.SCHEDULE_TOPIC else self.encoder.dispatch_tags_code(rec, begin)
                dispatched.append(new_request(DispatchRequest, (
                    rec.topic, rec.queue_id, phys, rec.total, code, begin, qoff, rec.keys, rec.uniq_key,
                    rec.sys_flag, rec.prepared_transaction_offset, rec.properties_string)))
                phys += rec.total
            mf.append_message(b"".join(parts))
            mf.store_timestamp = begin
            if self.on_appended is not None:
                self.on_appended(base, phys, dispatched)
            self.begin_time_in_lock = 0
        return self._finish(AppendMessageResult(
            AppendMessageStatus.PUT_OK, base, total, begin, first_qoff, len(recs), now_ms() - begin,
            self.store_host_bytes, self.store_port, offsets, [r.uniq_key for r in recs]), wait)

    def flush_until(self, offset: int, timeout_ms: int) -> bool:
        """Flush until `offset` is on disk; concurrent callers share one flush (group commit)."""
        mfq = self.mapped_file_queue
        deadline = time.monotonic() + timeout_ms / 1000.0
        while mfq.flushed_where < offset:
            if not self.flush_lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
                return False
            try:
                if mfq.flushed_where < offset:
                    if mfq.transient_store_pool is not None:
                        for _ in range(2):  # commit the write buffers first (a batch may span files)
                            if mfq.commit(0):
                                break
                    mfq.flush(0)
                    if mfq.flushed_where < offset:
                        mfq.flush(0)  # a batch may end in the next file
            finally:
                self.flush_lock.release()
            if time.monotonic() > deadline and mfq.flushed_where < offset:
                return False
        return True

    def flush(self, least_pages: int = 0) -> bool:
        """Commit (with the transient pool) and flush one file; True when nothing moved."""
        with self.flush_lock:
            mfq = self.mapped_file_queue
            if least_pages == 0 and mfq.transient_store_pool is not None:
                for _ in range(2):
                    if mfq.commit(0):
                        break
            return mfq.flush(least_pages)

    def is_os_page_cache_busy(self) -> bool:
        begin = self.begin_time_in_lock
        return begin > 0 and now_ms() - begin > self.config.os_page_cache_busy_timeout_mills

    def warm_due(self) -> bool:
        """The writer is within half of `warm_ahead_bytes` of the current file's warm end (a cheap look)."""
        window = self.config.warm_ahead_bytes
        if window <= 0:
            return False
        files = self.mapped_file_queue.mapped_files
        if not files:
            return False
        mf = files[-1]
        return mf.warmed_position - mf.wrote_position <= window // 2 and mf.warmed_position < mf.file_size

    def warm_ahead(self) -> int:
        """Fault in the current file's pages up to `warm_ahead_bytes` past the write position once less than
        half of that is left warm (`MappedFile.warm`; `WarmAheadService` calls it on its own thread, and
        the kernel works without the GIL). Returns the bytes warmed now."""
        if not self.warm_due():
            return 0
        mf = self.mapped_file_queue.mapped_files[-1]
        return mf.warm(mf.wrote_position + self.config.warm_ahead_bytes)

    # -- read -----------------------------------------------------------------------------------
    def get_max_offset(self) -> int:
        return self.mapped_file_queue.get_max_offset()

    def get_min_offset(self) -> int:
        mf = self.mapped_file_queue.get_first_mapped_file()
        if mf is None:
            return -1
        return mf.file_from_offset if mf.available else self.roll_next_file(mf.file_from_offset)

    def roll_next_file(self, offset: int) -> int:
        return offset + self.file_size - offset % self.file_size

    def find_file(self, offset: int) -> MappedFile | None:
        return self.mapped_file_queue.find_mapped_file_by_offset(offset, offset == 0)

    def get_data(self, offset: int) -> tuple[int, memoryview] | None:
        """Bytes from `offset` to the readable end of its file (`CommitLog.getData`)."""
        mf = self.find_file(offset)
        if mf is None:
            return None
        pos = offset % self.file_size
        view = mf.select_mapped_buffer(pos)
        return (offset, view) if view is not None else None

    def get_message(self, offset: int, size: int) -> memoryview | None:
        """`size` bytes at `offset` when they are readable, else None."""
        mf = self.find_file(offset)
        if mf is None:
            return None
        return mf.select_mapped_buffer(offset % self.file_size, size)

    def read_record(self, offset: int) -> memoryview | None:
        """The whole record at `offset`, its size read from its first 4 bytes (`selectOneMessageByOffset`)."""
        head = self.get_message(offset, 4)
        if head is None:
            return None
        size = _INT.unpack_from(head, 0)[0]
        if size <= 8:
            return None
        return self.get_message(offset, size)

    def look_message_by_offset(self, offset: int, size: int | None = None) -> MessageExt | None:
        """The record at `offset` decoded (`codec.decode_message`), or None. With the native core a whole
        record the C pull decoder takes is decoded there (the same fields), read through one file look-up
        (an END_TRANSACTION reads its half message this way); anything else goes the Python way."""
        pull = codec.pull_native
        if pull is not None and not size:
            data = self.get_data(offset)
            if data is None:
                return None
            view = data[1]
            total = _INT.unpack_from(view, 0)[0] if len(view) >= 4 else 0
            if 8 < total <= len(view):
                out: list[MessageExt] = []
                if pull.decode_records(bytes(view[:total]), 0, out, False) == total and len(out) == 1:
                    return out[0]
        buf = self.get_message(offset, size) if size else self.read_record(offset)
        if buf is None:
            return None
        try:
            return codec.decode_message(buf, 0)
        except codec.CorruptRecordError:
            return None

    def pickup_store_timestamp(self, offset: int, size: int) -> int:
        """Store time of the record at `offset` (-1 when unreadable), as `CommitLog.pickupStoreTimestamp`."""
        if offset < self.get_min_offset():
            return -1
        buf = self.get_message(offset, size)
        if buf is None or len(buf) < 64:
            return -1
        sys_flag = _INT.unpack_from(buf, codec.SYSFLAG_POSITION)[0]
        return codec._LONG.unpack_from(buf, codec.store_timestamp_position(sys_flag))[0]

    def shutdown(self) -> None:
        self.mapped_file_queue.shutdown()
