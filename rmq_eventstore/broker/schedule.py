"""Delay levels (spec §14): `SCHEDULE_TOPIC_XXXX`, `delayOffset.json`, re-put to the real topic when due.

A message sent with the `DELAY` property (level 1..N of `messageDelayLevel`) is stored in
`SCHEDULE_TOPIC_XXXX`, queue `level - 1`, with `REAL_TOPIC` / `REAL_QID` remembering where it belongs
(`transform_delay_level_message`, RocketMQ's `HookUtils.handleScheduleMessage`).
`ScheduleMessageService` walks each level's queue from the offset recorded in `delayOffset.json` and,
once a message's delivery time (store time + the level's delay) has come, puts a copy into its real
topic and queue (`DeliverDelayedMessageTimerTask`): same body, flag, properties, sysFlag, born time and
host, reconsume times; `DELAY` removed, `WAIT=false`, `REAL_TOPIC` / `REAL_QID` kept.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from typing import TYPE_CHECKING

from ..store import Message, MessageExt, MessageStore, codec
from ..store.config_files import TopicConfig
from ..store.status import GetMessageStatus
from ..store.topic import RMQ_SYS_SCHEDULE_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC

if TYPE_CHECKING:
    from ..store.commitlog import PutMessageResult

log = logging.getLogger(__name__)

PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_WAIT = "WAIT"
_TIMER_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_LEVEL_RE = re.compile(r"^(\d+)([smhd])$")
TICK_SECONDS = 0.1  # DELAY_FOR_A_WHILE: a level whose head is not due yet is looked at again after 100 ms
ERROR_BACKOFF_SECONDS = 1.0
PERSIST_INTERVAL_SECONDS = 10.0  # flushDelayOffsetInterval


def parse_delay_levels(spec: str) -> list[int]:
    """`messageDelayLevel` ("1s 5s 10s 30s 1m ... 2h") → delays in ms, level 1 first (`parseDelayLevel`)."""
    out = []
    for token in spec.split():
        m = _LEVEL_RE.match(token)
        if m is None:
            raise ValueError(f"bad messageDelayLevel entry {token!r} (expected a number and s/m/h/d)")
        out.append(int(m.group(1)) * _UNITS[m.group(2)])
    if not out:
        raise ValueError("messageDelayLevel is empty")
    return out


def _set_property(props: str, name: str, value: str) -> str:
    props = codec.delete_property(props, name)
    if props and not props.endswith(codec.PROPERTY_SEPARATOR):
        props += codec.PROPERTY_SEPARATOR
    return f"{props}{name}{codec.NAME_VALUE_SEPARATOR}{value}{codec.PROPERTY_SEPARATOR}"


def get_property(props: str, name: str) -> str | None:
    """One property of a properties string (without parsing the rest)."""
    marker = f"{name}{codec.NAME_VALUE_SEPARATOR}"
    framed = codec.PROPERTY_SEPARATOR + props
    i = framed.find(codec.PROPERTY_SEPARATOR + marker)
    if i < 0:
        return None
    start = i + 1 + len(marker)
    end = framed.find(codec.PROPERTY_SEPARATOR, start)
    return framed[start:] if end < 0 else framed[start:end]


def set_property(props: str, name: str, value: str) -> str:
    """`props` with `name` set to `value` (any previous value removed)."""
    return _set_property(props, name, value)


def transform_delay_level_message(msg: Message, max_level: int) -> bool:
    """Move a message with `DELAY > 0` into `SCHEDULE_TOPIC_XXXX` (in place); True if it was moved.

    Only for non-transactional or committed messages, as `HookUtils.handleScheduleMessage`; the level is
    clamped to `max_level`. The message must carry a properties string.
    """
    props = msg.properties_string or ""
    if PROPERTY_DELAY not in props or codec.transaction_value(msg.sys_flag) not in (
            codec.TRANSACTION_NOT_TYPE, codec.TRANSACTION_COMMIT_TYPE):
        return False
    raw = get_property(props, PROPERTY_DELAY)
    try:
        level = int(raw) if raw is not None else 0
    except ValueError:
        return False
    if level <= 0:
        return False
    level = min(level, max_level)
    for name in _TIMER_PROPERTIES:
        props = codec.delete_property(props, name)
    props = _set_property(props, PROPERTY_DELAY, str(level))
    props = _set_property(props, PROPERTY_REAL_TOPIC, msg.topic)
    props = _set_property(props, PROPERTY_REAL_QID, str(msg.queue_id))
    msg.properties_string = props
    msg.topic = RMQ_SYS_SCHEDULE_TOPIC
    msg.queue_id = level - 1
    return True


class ScheduleMessageService:
    """Delivers due delayed messages from `SCHEDULE_TOPIC_XXXX` to their real topics (one thread).

    Progress per level lives in the store's `delay_offset_manager` (delayOffset.json), persisted every
    10 s and at shutdown, so a restart neither loses nor repeats a delivered level position.
    """

    def __init__(self, store: MessageStore, delay_levels: str | None = None) -> None:
        self.store = store
        self.delay_ms = parse_delay_levels(delay_levels or store.config.message_delay_level)
        self.max_level = len(self.delay_ms)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.delivered = 0

    def start(self) -> None:
        tcm = self.store.topic_config_manager
        tc = tcm.get(RMQ_SYS_SCHEDULE_TOPIC)
        if tc is None or tc.write_queue_nums < self.max_level:
            tcm.put(TopicConfig(RMQ_SYS_SCHEDULE_TOPIC, self.max_level, self.max_level))
        self._correct_offsets()
        self._thread = threading.Thread(target=self._run, name="ScheduleMessageService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self.persist()

    def persist(self) -> None:
        try:
            self.store.delay_offset_manager.persist()
        except Exception:
            log.exception("could not persist delayOffset.json")

    def wakeup(self) -> None:
        """Look at the levels now (a delayed message was just stored)."""
        self._wake.set()

    def _correct_offsets(self) -> None:
        """`correctDelayOffset`: keep every level's offset within its queue's [min, max]."""
        dom = self.store.delay_offset_manager
        for level in range(1, self.max_level + 1):
            off = dom.query_offset(level)
            if off < 0:
                continue
            lo = max(self.store.get_min_offset_in_queue(RMQ_SYS_SCHEDULE_TOPIC, level - 1), 0)
            hi = self.store.get_max_offset_in_queue(RMQ_SYS_SCHEDULE_TOPIC, level - 1)
            if off < lo or off > hi:
                log.warning("correcting delay offset of level %d: %d -> %d", level, off, min(max(off, lo), hi))
                dom.update_offset(level, min(max(off, lo), hi))

    def _run(self) -> None:
        last_persist = time.monotonic()
        while not self._stop.is_set():
            backoff = TICK_SECONDS
            for level in range(1, self.max_level + 1):
                if self._stop.is_set():
                    break
                try:
                    self.deliver_level(level)
                except Exception:
                    log.exception("delivering delay level %d failed", level)
                    backoff = ERROR_BACKOFF_SECONDS
            if time.monotonic() - last_persist >= PERSIST_INTERVAL_SECONDS:
                last_persist = time.monotonic()
                self.persist()
            self._wake.wait(backoff)
            self._wake.clear()

    def deliver_level(self, level: int) -> int:
        """Deliver every due message at the head of a level's queue; returns how many were delivered."""
        store = self.store
        dom = store.delay_offset_manager
        qid = level - 1
        offset = max(dom.query_offset(level), 0)
        if offset >= store.get_max_offset_in_queue(RMQ_SYS_SCHEDULE_TOPIC, qid):
            return 0
        delay = self.delay_ms[qid]
        count = 0
        while not self._stop.is_set():
            r = store.get_message("SCHEDULE_DELIVER", RMQ_SYS_SCHEDULE_TOPIC, qid, offset, 32)
            if r is None:
                return count
            if r.status != GetMessageStatus.FOUND:
                if r.next_begin_offset != offset and r.status in (
                        GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_FOUND_NULL,
                        GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                    dom.update_offset(level, r.next_begin_offset)
                return count
            now = int(time.time() * 1000)
            for buf, qoff in zip(r.message_buffers, r.message_queue_offsets, strict=True):
                m = codec.decode_message(buf, 0)
                deliver_at = m.store_timestamp + delay
                if deliver_at > now + delay:  # correctDeliverTimestamp: the clock went back; deliver now
                    deliver_at = now
                if deliver_at > now:
                    dom.update_offset(level, qoff)
                    return count
                res = self._reput(m)
                if res is not None and not res.is_ok():
                    log.error("re-put of delayed message %s failed: %s; retrying", m.msg_id, res)
                    dom.update_offset(level, qoff)
                    raise RuntimeError(f"re-put failed: {res.status.name} {res.reason}")
                count += 1
                self.delivered += 1
                dom.update_offset(level, qoff + 1)
            offset = max(r.next_begin_offset, offset + 1)
            dom.update_offset(level, offset)
        return count

    def _reput(self, m: MessageExt) -> PutMessageResult | None:
        props = m.properties_string
        real_topic = get_property(props, PROPERTY_REAL_TOPIC)
        real_qid = get_property(props, PROPERTY_REAL_QID)
        if not real_topic or real_topic == RMQ_SYS_TRANS_HALF_TOPIC:
            log.warning("dropping delayed message %s: no usable REAL_TOPIC (%r)", m.msg_id, real_topic)
            return None
        try:
            qid = int(real_qid or "0")
        except ValueError:
            qid = 0
        for name in (PROPERTY_DELAY, *_TIMER_PROPERTIES):
            props = codec.delete_property(props, name)
        props = _set_property(props, PROPERTY_WAIT, "false")
        msg = Message(topic=real_topic, body=bytes(m.body), queue_id=qid, flag=m.flag, sys_flag=m.sys_flag,
                      born_timestamp=m.born_timestamp, born_host=m.born_host, reconsume_times=m.reconsume_times,
                      properties_string=props)
        return self.store.put_message(msg)
