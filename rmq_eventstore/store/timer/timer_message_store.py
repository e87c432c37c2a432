"""`TimerMessageStore`: messages delivered at any time, held on disk as RocketMQ 5 holds them.

A send with `TIMER_DELIVER_MS` (epoch ms), `TIMER_DELAY_SEC` or `TIMER_DELAY_MS` is stored on topic
`rmq_sys_wheel_timer` queue 0 with its real topic and queue in `REAL_TOPIC` / `REAL_QID` and its delivery
time in `TIMER_OUT_MS` (`transform_timer_message`, what RocketMQ's `HookUtils` does on the put path).

* The enqueue service reads that consume queue and files each message in the wheel: a unit in the timer log
  (`TimerLog`) chained to the slot of its delivery time (`TimerWheel`), nothing in Python memory, so a
  million pending timers cost two files, not RAM.
* The dequeue service turns the wheel one precision tick at a time (`timer_precision_ms`): when a tick is
  due it walks the slot's chain, reads each message from the commitlog and puts it back on its real topic
  and queue (UNIQ_KEY kept, `TIMER_DEQUEUE_MS` added).
* `config/timercheck` (`TimerCheckpoint`) records, after the timer log and the wheel are flushed, the next
  tick to read, the timer-log position and the consume-queue offset covered.

Recovery after a crash: the timer log is the wheel's redo log. Units written after the checkpoint are
replayed onto slots that miss them, the enqueue resumes after the last message already in the log, and the
dequeue resumes at the checkpoint's tick: ticks at or before the last store time found at start were
possibly delivered before the crash, so for them each message is looked up on its real topic (by UNIQ_KEY
and delivery time) first and delivered only when absent. Every pending timer is delivered once, late by at
most the downtime.

Not built: rolling of delays longer than the wheel (RocketMQ's `timerRollWindowSlot`): delays are limited
to `timer_max_delay_sec`, which must fit in the wheel; deleting timer-log files whose timers are all
delivered; cancelling a timer (`TIMER_DEL_UNIQKEY`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import TYPE_CHECKING

from ...common import Message, MessageExt
from ...common.properties import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_MS,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    PROPERTY_TIMER_DEQUEUE_MS,
    PROPERTY_TIMER_ENQUEUE_MS,
    PROPERTY_TIMER_OUT_MS,
    delete_property,
    get_property,
    set_property,
)
from ...common.status import PutMessageStatus
from ...common.tags import java_string_hash
from ...common.topic import RMQ_SYS_WHEEL_TIMER_TOPIC
from .timer_checkpoint import TimerCheckpoint
from .timer_log import MAGIC_DEFAULT, TimerLog, TimerUnit
from .timer_wheel import TimerWheel

if TYPE_CHECKING:
    from ..message_store import MessageStore

log = logging.getLogger(__name__)

TIMER_TOPIC = RMQ_SYS_WHEEL_TIMER_TOPIC
TIMER_GROUP = "CID_RMQ_SYS_TIMER"  # reads the timer topic's consume queue (its offset is in timercheck)
ENQUEUE_BATCH = 256


class TimerMessageError(ValueError):
    """A timer message that cannot be accepted (bad or too far delivery time)."""


class _Stopped(Exception):
    """The store stopped while a delivery was being retried."""


# Put statuses a retry cannot mend (RocketMQ's doPut answers PUT_NO_RETRY for them)
_PUT_NO_RETRY = frozenset((PutMessageStatus.MESSAGE_ILLEGAL, PutMessageStatus.PROPERTIES_SIZE_EXCEEDED,
                           PutMessageStatus.WHEEL_TIMER_NOT_ENABLE, PutMessageStatus.WHEEL_TIMER_MSG_ILLEGAL))


def _timer_props_present(props: str) -> bool:
    return "TIMER_DELIVER_MS\x01" in props or "TIMER_DELAY_SEC\x01" in props or "TIMER_DELAY_MS\x01" in props


def transform_timer_message(msg: Message, precision_ms: int, max_delay_sec: int, now_ms: int) -> bool:
    """Turn a message with timer properties into its timer-topic form, in place; True when it was one.

    A delivery time already due leaves the message as it is (delivered at once). Raises
    `TimerMessageError` for a value that is not a number, a delay past `max_delay_sec`, or a message that
    also has a delay level."""
    props = msg.properties_string or ""
    if not _timer_props_present(props):
        return False
    try:
        if (v := get_property(props, PROPERTY_TIMER_DELIVER_MS)) is not None:
            deliver = int(v)
        elif (v := get_property(props, PROPERTY_TIMER_DELAY_SEC)) is not None:
            deliver = now_ms + int(v) * 1000
        else:
            deliver = now_ms + int(get_property(props, PROPERTY_TIMER_DELAY_MS) or "")
    except ValueError:
        raise TimerMessageError("a timer property (TIMER_DELIVER_MS, TIMER_DELAY_SEC, TIMER_DELAY_MS) is not "
                                "a whole number") from None
    if get_property(props, PROPERTY_DELAY_TIME_LEVEL) is not None:
        raise TimerMessageError("a message cannot have both a delay level and a timer")
    if deliver - now_ms > max_delay_sec * 1000:
        raise TimerMessageError(f"the delivery time is {(deliver - now_ms) // 1000} s away, more than "
                                f"timerMaxDelaySec {max_delay_sec}")
    if deliver <= now_ms:
        return False
    deliver = -(-deliver // precision_ms) * precision_ms  # up to the next tick: never early, late by < a tick
    props = set_property(props, PROPERTY_TIMER_OUT_MS, str(deliver))
    props = set_property(props, PROPERTY_REAL_TOPIC, msg.topic)
    props = set_property(props, PROPERTY_REAL_QUEUE_ID, str(msg.queue_id))
    msg.properties_string = props
    msg.topic = TIMER_TOPIC
    msg.queue_id = 0
    return True


class TimerMessageStore:
    """The enqueue and dequeue services over the timer log, the wheel and the checkpoint (module docstring)."""

    def __init__(self, store: MessageStore, precision_ms: int = 1000, max_delay_sec: int = 259_200,
                 slots_total: int = 7 * 86_400, timer_log_file_size: int = 100 * 1024 * 1024,
                 flush_interval_ms: int = 1000) -> None:
        if max_delay_sec * 1000 >= slots_total * 2 * precision_ms:
            raise ValueError(f"timer_max_delay_sec {max_delay_sec} does not fit in a wheel of {slots_total} x 2 "
                             f"slots of {precision_ms} ms")
        root = store.config.store_path_root_dir
        self.store = store
        self.precision_ms = precision_ms
        self.max_delay_sec = max_delay_sec
        self.flush_interval_ms = flush_interval_ms
        self.timer_log = TimerLog(os.path.join(root, "timerlog"), timer_log_file_size)
        self.wheel = TimerWheel(os.path.join(root, "timerwheel"), slots_total, precision_ms)
        self.checkpoint = TimerCheckpoint.load(os.path.join(root, "config", "timercheck"))
        self._lock = threading.Lock()  # the enqueue's (queue offset, timer-log end) pair
        self._stop = threading.Event()
        self._arrived = threading.Event()
        self._threads: list[threading.Thread] = []
        self.queue_offset = 0
        self.read_time_ms = 0
        self._skip_until_phy = -1  # commitlog offsets up to this one are already in the timer log
        self._replay_from = 0  # the checkpoint's timer-log position while the enqueue is still skipping
        self._dedup_until_ms = 0  # ticks up to this time may have been delivered before a crash
        self.delivered = 0
        self.enqueued = 0

    # -- lifecycle ---------------------------------------------------------------------------------------
    def load(self) -> None:
        """Map the files and recover (replay the timer log's tail onto the wheel)."""
        self.timer_log.load()
        cp = self.checkpoint
        self.queue_offset = cp.last_timer_queue_offset
        now = int(time.time() * 1000)
        replayed = 0
        earliest = now
        self._replay_from = cp.last_timer_log_flush_pos
        for pos, unit in self.timer_log.iter_from(cp.last_timer_log_flush_pos):
            slot = self.wheel.get(unit.deliver_ms)
            if slot.last_pos < pos:
                self.wheel.put(unit.deliver_ms, slot.first_pos if slot.num else pos, pos, slot.num + 1)
                replayed += 1
            self._skip_until_phy = max(self._skip_until_phy, unit.offset_py)
            earliest = min(earliest, unit.deliver_ms)
        # Without a checkpoint (killed before the first one was written) the wheel is read again from its
        # earliest unit: starting at `now` would skip the ticks due while the broker was down.
        self.read_time_ms = (cp.last_read_time_ms or earliest) // self.precision_ms * self.precision_ms
        # Ticks due by now may have been delivered before the store stopped; so may the timers the enqueue
        # delivered at once (their tick had passed), which have no unit. That holds with or without a
        # checkpoint: a process killed before its first one may have delivered timers too.
        self._dedup_until_ms = now
        if replayed:
            log.info("timer store: %d timer-log units replayed onto the wheel", replayed)

    def start(self) -> None:
        self.store.add_message_arriving_listener(self._on_arrival, queues=[(TIMER_TOPIC, 0)])
        for target, name in ((self._enqueue_loop, "TimerEnqueueService"), (self._dequeue_loop, "TimerDequeueService")):
            t = threading.Thread(target=target, name=name, daemon=True)
            t.start()
            self._threads.append(t)

    def shutdown(self) -> None:
        self._stop.set()
        self._arrived.set()
        for t in self._threads:
            t.join(timeout=10)
        self._persist()
        self.timer_log.shutdown()
        self.wheel.close()

    def _on_arrival(self, batch: dict[tuple[str, int], int]) -> None:
        if (TIMER_TOPIC, 0) in batch:
            self._arrived.set()

    # -- enqueue ---------------------------------------------------------------------------------------------
    def _enqueue_loop(self) -> None:
        while not self._stop.is_set():
            try:
                if not self.enqueue_once():
                    self._arrived.wait(0.05)
                    self._arrived.clear()
            except _Stopped:
                return
            except Exception:
                log.exception("timer enqueue failed")
                self._stop.wait(1.0)

    def enqueue_once(self) -> int:
        """File the timer messages that arrived since the last call; how many."""
        r = self.store.get_message(TIMER_GROUP, TIMER_TOPIC, 0, self.queue_offset, ENQUEUE_BATCH, None)
        if r is None or not r.messages:
            return 0
        n = 0
        for m in r.messages:
            with self._lock:
                if m.commit_log_offset > self._skip_until_phy:
                    self._enqueue(m)
                    n += 1
                if m.commit_log_offset >= self._skip_until_phy:
                    # past every message whose unit was replayed at load: from here on the units of the
                    # consume-queue entries at or after queue_offset are those after the log's end
                    self._skip_until_phy = -1
                self.queue_offset = m.queue_offset + 1
        self.enqueued += n
        return n

    def _enqueue(self, m: MessageExt) -> None:
        deliver = int(m.properties.get(PROPERTY_TIMER_OUT_MS) or 0)
        if deliver < self.read_time_ms:  # the wheel has passed that tick already: deliver now
            self._deliver(m, deliver, dedup=deliver <= self._dedup_until_ms)
            return
        slot = self.wheel.get(deliver)
        now = int(time.time() * 1000)
        topic = m.properties.get(PROPERTY_REAL_TOPIC, "")
        pos = self.timer_log.append(TimerUnit(52, slot.last_pos, MAGIC_DEFAULT, now, deliver - now,
                                              m.commit_log_offset, m.store_size, java_string_hash(topic), 0))
        self.wheel.put(deliver, slot.first_pos if slot.num else pos, pos, slot.num + 1)

    # -- dequeue ---------------------------------------------------------------------------------------------
    def _dequeue_loop(self) -> None:
        last_persist = time.monotonic()
        while not self._stop.is_set():
            try:
                now = int(time.time() * 1000)
                if self.read_time_ms > now:
                    self._stop.wait(min((self.read_time_ms - now) / 1000.0, 0.05))
                else:
                    self.dequeue_tick()
                if time.monotonic() - last_persist >= self.flush_interval_ms / 1000.0:
                    self._persist()
                    last_persist = time.monotonic()
            except _Stopped:
                return
            except Exception:
                log.exception("timer dequeue failed")
                self._stop.wait(1.0)

    def dequeue_tick(self) -> int:
        """Deliver the slot of the current tick and move to the next; how many were delivered."""
        with self._lock:  # no enqueue into the slot being read
            return self._dequeue_tick()

    def _dequeue_tick(self) -> int:
        """The tick's delivery; `read_time_ms` moves on only when every unit of the slot was handled (a
        stop while a put is retried leaves the tick to the next start, whose per-message check skips what
        went out)."""
        t = self.read_time_ms
        slot = self.wheel.get(t)
        n = 0
        if slot.num:
            units = []
            pos = slot.last_pos
            while pos >= 0 and len(units) < slot.num:
                unit = self.timer_log.read(pos)
                if unit is None:
                    break
                if unit.deliver_ms // self.precision_ms == t // self.precision_ms:
                    units.append(unit)
                pos = unit.prev_pos
            for unit in reversed(units):  # oldest first
                msg = self.store.look_message_by_offset(unit.offset_py, unit.size_py)
                if msg is not None and self._deliver(msg, unit.deliver_ms, dedup=t <= self._dedup_until_ms):
                    n += 1
        self.read_time_ms = t + self.precision_ms
        return n

    def _deliver(self, m: MessageExt, deliver_ms: int, dedup: bool) -> bool:
        props = m.properties_string
        topic = get_property(props, PROPERTY_REAL_TOPIC) or ""
        queue_id = int(get_property(props, PROPERTY_REAL_QUEUE_ID) or 0)
        if dedup and self._already_delivered(topic, m.uniq_key, deliver_ms):
            return False
        for name in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID):
            props = delete_property(props, name)
        props = set_property(props, PROPERTY_TIMER_ENQUEUE_MS, str(m.store_timestamp))
        props = set_property(props, PROPERTY_TIMER_DEQUEUE_MS, str(int(time.time() * 1000)))
        out = Message(topic=topic, body=bytes(m.body), queue_id=queue_id, flag=m.flag, properties_string=props,
                      sys_flag=m.sys_flag, born_timestamp=m.born_timestamp, born_host=m.born_host,
                      reconsume_times=m.reconsume_times)
        while True:
            r = self.store.put_message(out)
            if r.is_ok():
                break
            if r.status in _PUT_NO_RETRY:
                log.error("timer message %s not delivered to %s: %s %s", m.uniq_key, topic, r.status.name,
                          r.reason or "")
                return False
            # RocketMQ's doPut: anything else (a store not writeable, a file not created, an unknown error)
            # is retried, the tick held, until the put succeeds; stopping leaves the tick to the next start
            log.warning("timer message %s not delivered to %s yet (%s %s): retrying", m.uniq_key, topic,
                        r.status.name, r.reason or "")
            if self._stop.wait(max(self.precision_ms / 2000.0, 0.05)):
                raise _Stopped
        self.delivered += 1
        return True

    def _already_delivered(self, topic: str, uniq_key: str | None, deliver_ms: int) -> bool:
        if not uniq_key:
            return False
        self.store.wait_for_dispatch(30.0)
        r = self.store.query_message(topic, uniq_key, 64, batch_limit=64)
        return any(x.uniq_key == uniq_key and x.properties.get(PROPERTY_TIMER_OUT_MS) == str(deliver_ms)
                   for x in r.messages)

    # -- checkpoint ------------------------------------------------------------------------------------------
    def _persist(self) -> None:
        """Flush the timer log and the wheel, then record how far both services got."""
        with self._lock:
            queue_offset = self.queue_offset
            # While the enqueue still skips the messages filed before a restart, their units lie between
            # the loaded checkpoint's position and the end: the checkpoint keeps that position, or a crash
            # now would restart after them with nothing to skip and file them a second time.
            log_end = self.timer_log.max_offset() if self._skip_until_phy < 0 else self._replay_from
        self.timer_log.flush()
        self.wheel.flush()
        cp = self.checkpoint
        cp.last_timer_queue_offset = queue_offset
        cp.last_timer_log_flush_pos = log_end
        cp.last_read_time_ms = self.read_time_ms
        cp.flush()

    def pending_hint(self) -> int:
        """Timer messages filed but not yet enqueued (0 once the enqueue caught up)."""
        return max(self.store.get_max_offset_in_queue(TIMER_TOPIC, 0) - self.queue_offset, 0)


__all__ = ["TIMER_GROUP", "TIMER_TOPIC", "TimerMessageError", "TimerMessageStore", "transform_timer_message"]

