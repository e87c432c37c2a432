"""Delay levels (spec §14): `SCHEDULE_TOPIC_XXXX`, `delayOffset.json`, re-put to the real topic when due.

A message sent with the `DELAY` property (level 1..N of `messageDelayLevel`) is stored in
`SCHEDULE_TOPIC_XXXX`, queue `level - 1`, with `REAL_TOPIC` / `REAL_QID` remembering where it belongs
(`transform_delay_level_message`, RocketMQ's `HookUtils.handleScheduleMessage`).
`ScheduleMessageService` walks each level's queue from the offset recorded in `delayOffset.json` and,
once a message's delivery time (store time + the level's delay) has come, puts a copy into its real
topic and queue (`DeliverDelayedMessageTimerTask`): same body, flag, properties, sysFlag, born time and
host, reconsume times; `DELAY` removed, `WAIT=false`, `REAL_TOPIC` / `REAL_QID` kept.

The delivery time is read from the consume queue: the store writes it as the tagsCode of every
`SCHEDULE_TOPIC_XXXX` unit (store time + the level's delay, as RocketMQ's `checkMessageAndReturnSize`),
so a level is scanned without reading the commitlog until a message is due.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ..common import Message, MessageExt, codec
from ..common.delay import parse_delay_levels
from ..common.properties import get_property, set_property
from ..common.topic import RMQ_SYS_SCHEDULE_TOPIC, RMQ_SYS_TRANS_HALF_TOPIC
from ..common.topic_config import TopicConfig
from ..store import MessageStore

if TYPE_CHECKING:
    from ..store.commitlog import PutMessageResult

log = logging.getLogger(__name__)

PROPERTY_DELAY = "DELAY"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_WAIT = "WAIT"
_TIMER_PROPERTIES = ("TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS")
TICK_SECONDS = 0.1  # DELAY_FOR_A_WHILE: a level whose head is not due yet is looked at again after 100 ms
ERROR_BACKOFF_SECONDS = 1.0
PERSIST_INTERVAL_SECONDS = 10.0  # flushDelayOffsetInterval


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
        level = codec.java_parse_int(raw) if raw is not None else 0
    except ValueError:
        return False
    if level <= 0:
        return False
    level = min(level, max_level)
    for name in _TIMER_PROPERTIES:
        props = codec.delete_property(props, name)
    props = set_property(props, PROPERTY_DELAY, str(level))
    props = set_property(props, PROPERTY_REAL_TOPIC, msg.topic)
    props = set_property(props, PROPERTY_REAL_QID, str(msg.queue_id))
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
        if delay_levels and delay_levels != store.config.message_delay_level:
            # the broker's messageDelayLevel overrides the store's: the store then writes delivery times
            # (consume-queue tagsCodes) with these levels too
            store.commit_log.encoder.delay_levels = tuple(parse_delay_levels(delay_levels))
            store.config.message_delay_level = delay_levels
        self.delay_ms = list(store.commit_log.encoder.delay_levels)
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
        """Deliver every due message at the head of a level's queue; returns how many were delivered.

        Due means the unit's tagsCode (the delivery time) is not in the future, corrected to now when it
        lies more than one delay period ahead (`correctDeliverTimestamp`: the clock went back). A tagsCode
        that is a consume-queue-ext address is recomputed from the record's store time, as RocketMQ does.
        """
        store = self.store
        dom = store.delay_offset_manager
        qid = level - 1
        cq = store.find_consume_queue(RMQ_SYS_SCHEDULE_TOPIC, qid, create=False)
        if cq is None:
            return 0
        offset = max(dom.query_offset(level), 0)
        lo = cq.get_min_offset_in_queue()
        if offset < lo:
            offset = lo
            dom.update_offset(level, offset)
        delay = self.delay_ms[qid]
        count = 0
        while not self._stop.is_set() and offset < cq.get_max_offset_in_queue():
            units = cq.get_units(offset, 32)
            if not units:
                return count
            now = int(time.time() * 1000)
            for phy, size, tags_code in units:
                deliver_at = tags_code
                if deliver_at < -0x80000000:  # an ext address, not a time (isTagsCodeValid)
                    deliver_at = store.commit_log.pickup_store_timestamp(phy, size) + delay
                if deliver_at > now + delay:  # correctDeliverTimestamp
                    deliver_at = now
                if deliver_at > now:
                    dom.update_offset(level, offset)
                    return count
                m = store.look_message_by_offset(phy, size)
                if m is not None:  # None: the record was cleaned up; RocketMQ skips it too
                    res = self._reput(m)
                    if res is not None and not res.is_ok():
                        log.error("re-put of delayed message %s failed: %s; retrying", m.msg_id, res)
                        dom.update_offset(level, offset)
                        raise RuntimeError(f"re-put failed: {res.status.name} {res.reason}")
                    count += 1
                    self.delivered += 1
                offset += 1
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
        props = set_property(props, PROPERTY_WAIT, "false")
        msg = Message(topic=real_topic, body=bytes(m.body), queue_id=qid, flag=m.flag, sys_flag=m.sys_flag,
                      born_timestamp=m.born_timestamp, born_host=m.born_host, reconsume_times=m.reconsume_times,
                      properties_string=props)
        return self.store.put_message(msg)
