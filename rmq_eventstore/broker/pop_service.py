"""POP consumption as RocketMQ 5 does it: pop, ack, change of invisible time, and the revive service.

* **Pop** reads a group's messages from a queue (or from every queue of the topic and of the group's pop
  retry topic `%RETRY%<group>_<topic>`) and makes one checkpoint per queue (`PopCheckPoint`: which offsets,
  popped when, invisible for how long). The checkpoint goes to the buffer (`PopBufferMergeService`,
  pop_buffer.py, with its journal) and reaches the revive topic `rmq_sys_REVIVE_LOG_<cluster>` (tag `ck`,
  JSON) only if acks do not settle it within its bound; the group's consume offset moves past a pop once
  its checkpoint is stored or settled. Each message's receipt handle (`POP_CK`, `ExtraInfoUtil`'s format)
  names its checkpoint.
* **Ack** settles the message in the buffer, or, when its checkpoint is stored, writes an ack record to the
  same revive queue (tag `ack`, `AckMsg` JSON). **Change invisible time** stores the queue's buffered
  checkpoints, writes a new checkpoint for the message, then acks the old one.
* **Revive** (`PopReviveService`, a thread) reads the revive queues with group `CID_RMQ_SYS_REVIVE_GROUP`,
  matches acks to checkpoints, and when a checkpoint's invisible time is over puts every message it holds
  that nobody acked on the pop retry topic with its reconsume count raised (the group's DLQ `%DLQ%<group>`
  past its `retryMaxTimes`). The group's revive offset moves only past checkpoints that are settled.

Everything is in the store: checkpoints, acks and offsets (consumerOffset.json). The pending checkpoints in
memory are a cache of the revive queues from the revive offset on, rebuilt by reading them again after a
restart, and the checkpoints found there also move the groups' consume offsets past what they popped
(consume offsets are flushed every few seconds, checkpoints at once). A crash can deliver again what was
in flight (popped and not acked, or revived but not yet counted); it never loses a message nobody acked. Checkpoints come due by the revive service's own clock rather than as
timer messages (RocketMQ 5 can do either; reading the revive queue in order is what its revive service
does in both cases), so revive needs no timer store.
"""

from __future__ import annotations

import heapq
import itertools
import json
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..common import GetMessageStatus, Message, MessageExt, codec
from ..common.filter import MessageFilter
from ..common.native import native
from ..common.pop import (
    ACK_TAG,
    BATCH_ACK_TAG,
    CK_TAG,
    REVIVE_GROUP,
    REVIVE_QUEUE_NUM,
    AckMsg,
    BatchAck,
    ExtraInfo,
    PopCheckPoint,
    offsets_text,
    pop_retry_topic,
    revive_topic,
)
from ..common.properties import (
    PROPERTY_FIRST_POP_TIME,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RETRY_TOPIC,
    get_property,
    set_property,
)
from ..common.rng import rng
from ..common.topic import DLQ_GROUP_TOPIC_PREFIX
from ..common.topic_config import PermName
from ..store.config_files import ConsumerOffsetManager as ConsumerOffsetFile
from ..store.message_store import _READ_STATUS, _RECORD_LAYOUT, MAX_PULL_MSG_SIZE
from .pop_buffer import PopBufferMergeService, PopJournal, _Entry

if TYPE_CHECKING:
    from ..store.consume_queue import ConsumeQueue
    from .broker import Broker

log = logging.getLogger(__name__)

REVIVE_INTERVAL = 0.1  # seconds between revive rounds (RocketMQ's reviveInterval is 1 s)
POP_FROM_RETRY_PROBABILITY = 20  # percent of pops that look at the retry topic first
_RECORD_LAYOUT_SIZE = _RECORD_LAYOUT.size
# THE POP CORE of `_native` (pop_now's registration of a contiguous pop: checkpoint, buffer entry, journal line,
# response texts); None without the native core (RMQ_EVENTSTORE_PURE=1, not built): the Python block serves
_POP_REGISTER = getattr(native, "pop_register", None)
# THE POP READ of `_native`: get_units_raw + read_runs (+ _file_span) in one call; None without the native core
_POP_READ = getattr(native, "pop_read", None)
_QUEUE_MAX = getattr(native, "queue_max", None)
_QUEUE_LIVE = getattr(native, "queue_live", None)
_POP_QUEUE = getattr(native, "pop_queue", None)
# THE POP OFFSET of `_native`: PopBufferMergeService.pop_offset in C; None without the native core
_POP_OFFSET = getattr(native, "pop_offset", None)


def queue_live_py(cq_table: dict, plan: list[tuple[str, int, bool]],
                  first: int) -> list[tuple[str, int, bool, ConsumeQueue, int]]:
    """The queues of `plan`, read from index `first` on and round, that the store has and that hold something
    (max offset > 0), with their consume queue and max offset: what `PopService.pop_now` reads or counts.
    `_native.queue_live` makes it in C (this is its reference, and what serves without it)."""
    live = []
    for t, q, retry in (plan[first:] + plan[:first] if first else plan):
        queues = cq_table.get(t)
        cq = queues.get(q) if queues is not None else None
        if cq is None:
            continue
        top = cq.get_max_offset_in_queue()
        if top > 0:
            live.append((t, q, retry, cq, top))
    return live


@dataclass
class PopResult:
    """What a pop found: the stored records (`bodies`: per queue read, its records back to back, the
    response body as they are; `buffers` splits them, `messages` decodes them on first access), how many
    (`count`), per queue start offsets and offsets."""

    pop_time: int
    invisible_time: int
    revive_qid: int
    bodies: list[bytes]
    start_offset_info: list[str]
    msg_offset_info: list[str]
    rest_num: int
    count: int = 0
    _messages: list[MessageExt] | None = None

    @property
    def body(self) -> bytes:
        """Every record popped, back to back (the POP response's body)."""
        bodies = self.bodies
        return bodies[0] if len(bodies) == 1 else b"".join(bodies)

    @property
    def buffers(self) -> list[bytes]:
        """One stored record per message (split off the bodies by each record's leading total size)."""
        out: list[bytes] = []
        for body in self.bodies:
            p = 0
            while p < len(body):
                size = int.from_bytes(body[p:p + 4], "big")
                out.append(body[p:p + size])
                p += size
        return out

    @property
    def messages(self) -> list[MessageExt]:
        if self._messages is None:
            self._messages = [codec.decode_message(b, 0) for b in self.buffers]
        return self._messages


class PopService:
    """Pop, ack, change of invisible time, and the revive thread (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self.revive_topic = revive_topic(broker.config.broker_cluster_name)
        self._locks: dict[tuple[str, str, int], threading.Lock] = {}
        self._locks_guard = threading.Lock()
        self._qid = rng.randrange(REVIVE_QUEUE_NUM)
        self._filters: dict[str, MessageFilter] = {}  # by expression: a filter is read-only once made
        self._retry_names: dict[tuple[str, str], str] = {}  # (group, topic) -> its pop retry topic
        self._topic_queues: dict[tuple[str, int], list[tuple[str, int, bool]]] = {}  # see _queues
        # pops waiting for an arrival: topic -> the events of the pops that read it (their topic and its pop
        # retry topic), so a dispatched batch wakes the pops of its topics only, not every waiting pop
        self._arrival = threading.Lock()
        self._arrival_waiters: dict[str, set[Any]] = {}  # objects with .set() (add_arrival_waiter)
        self._arrival_waiting = 0  # pops waiting (changed under _arrival)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # revive state per revive queue: read position and pending checkpoints by key
        self._read: dict[int, int] = {}
        self._pending: dict[int, OrderedDict[tuple, tuple[PopCheckPoint, int]]] = {}
        # per revive queue, the pending checkpoints by revive time (heap of (revive time, seq, key, ck); an item
        # whose key no longer maps to that ck is stale, skipped when it comes up): a round takes only what is due
        self._due: dict[int, list[tuple[int, int, tuple, PopCheckPoint]]] = {}
        self._due_seq = itertools.count()
        self._revive_lock = threading.Lock()  # a revive round, or a deleted topic's checkpoints being dropped
        self._deleted_at: dict[str, int] = {}  # topic -> when it was deleted (ms): older checkpoints are void
        self._deleted_limit = 1024
        self.revived = 0
        cfg = broker.config
        offsets = broker.offset_manager
        self._pop_offset_ctx: tuple | None = None  # _POP_OFFSET's (_make_pop_offset_ctx)
        self.buffer = PopBufferMergeService(
            lambda ck, qid: self._put_revive(ck.to_json(), CK_TAG, qid), offsets.commit, offsets.file.query_offset,
            enabled=cfg.enable_pop_buffer_merge, stay_ms=cfg.pop_ck_stay_buffer_time,
            margin_ms=cfg.pop_ck_stay_buffer_time_out, max_size=cfg.pop_ck_max_buffer_size)
        offsets.pop_frontier = self.buffer.frontier

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        self.broker.topic_manager.ensure(self.revive_topic, REVIVE_QUEUE_NUM, PermName.PERM_READ | PermName.PERM_WRITE)
        stored = self._recover_pop_offsets()
        journal = os.path.join(self.store.config.store_path_root_dir, "pop", "ckbuffer.journal")
        self._recover_buffer(journal, stored)
        if self.buffer.enabled:
            self.buffer.journal = PopJournal(journal)
            self.buffer.journal.reset([], {})
        elif os.path.exists(journal):  # recovered: its lines must not be applied again by a later start
            os.remove(journal)
        self.store.add_message_arriving_listener(self._on_arrival, when=(self, "_arrival_waiting"))  # POPs waiting
        self._thread = threading.Thread(target=self._revive_loop, name="PopReviveService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        with self._arrival:
            for events in self._arrival_waiters.values():
                for ev in events:
                    ev.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.buffer.flush_all()  # what is in flight comes back at its revive time after the restart too
        if self.buffer.journal is not None:  # everything is stored or settled now: only the offsets stay
            self.buffer.journal.reset([], self.buffer.committed_offsets())
            self.buffer.journal.close()

    def _recover_pop_offsets(self) -> set[tuple]:
        """Consume offsets are flushed every few seconds, checkpoints at once: after a crash, move each
        group's offset past what the checkpoints from the revive offset on say was popped, so that only
        what was in flight is delivered again. The keys of those checkpoints are returned."""
        offsets = self.broker.offset_manager
        keys: set[tuple] = set()
        self.store.wait_for_dispatch(60.0)
        for qid in range(REVIVE_QUEUE_NUM):
            pos = max(offsets.file.query_offset(REVIVE_GROUP, self.revive_topic, qid), 0)
            while True:
                r = self.store.get_message(REVIVE_GROUP, self.revive_topic, qid, pos, 256, None)
                if r is None or not r.messages:
                    break
                for m in r.messages:
                    pos = m.queue_offset + 1
                    if m.tags != CK_TAG:
                        continue
                    try:
                        ck = PopCheckPoint.from_json(bytes(m.body))
                    except (ValueError, KeyError):
                        continue
                    keys.add((ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time))
                    if ck.queue_offset_diff and self.broker.topic_manager.get(ck.topic) is not None:
                        end = ck.start_offset + max(ck.queue_offset_diff) + 1
                        if offsets.file.query_offset(ck.group, ck.topic, ck.queue_id) < end:
                            offsets.commit(ck.group, ck.topic, ck.queue_id, end)
        return keys

    def _recover_buffer(self, path: str, stored: set[tuple]) -> None:
        """The checkpoints a stopped or killed broker held in its buffer (its journal, `PopJournal`): the
        ones with unacked messages that are not in the revive topic yet are stored now (only those
        messages: they come back at their revive time), and each queue's offset moves past its pops, all
        of which are then stored or settled. A queue where a store fails keeps its offset (its pops are
        delivered again at once rather than lost)."""
        offsets = self.broker.offset_manager
        ends: dict[tuple[str, str, int], int] = {}
        failed: set[tuple[str, str, int]] = set()
        restored = 0
        entries, committed = PopJournal.recover(path, self.broker.config.broker_name)
        ends.update(committed)
        for ck, qid, next_offset, acked, was_stored in entries:
            qkey = (ck.group, ck.topic, ck.queue_id)
            key = (*qkey, ck.start_offset, ck.pop_time)
            full = (1 << len(ck.queue_offset_diff)) - 1
            if not was_stored and key not in stored and acked != full:
                diffs = [d for i, d in enumerate(ck.queue_offset_diff) if not acked >> i & 1]
                ck.num, ck.queue_offset_diff = len(diffs), diffs
                if not self._put_revive(ck.to_json(), CK_TAG, qid):
                    failed.add(qkey)
                    continue
                restored += 1
            ends[qkey] = max(ends.get(qkey, -1), next_offset)
        for (group, topic, queue_id), end in ends.items():
            if self.broker.topic_manager.get(topic) is None:
                continue  # deleted meanwhile: no offsets for it
            if (group, topic, queue_id) not in failed and offsets.file.query_offset(group, topic, queue_id) < end:
                offsets.commit(group, topic, queue_id, end)
        if ends:
            offsets.persist()
            log.info("POP checkpoint buffer recovered: %d checkpoints stored, offsets of %d queues moved",
                     restored, len(ends))

    def _on_arrival(self, batch: dict[tuple[str, int], int]) -> None:
        if self._arrival_waiting:  # read without the lock: a waiting pop looks again every 0.5 s anyway
            waiters = self._arrival_waiters
            with self._arrival:
                for topic, _ in batch:
                    events = waiters.get(topic)
                    if events:
                        for ev in events:
                            ev.set()

    def _lock(self, group: str, topic: str, queue_id: int) -> threading.Lock:
        key = (group, topic, queue_id)
        lock = self._locks.get(key)
        if lock is None:
            with self._locks_guard:
                lock = self._locks.setdefault(key, threading.Lock())
        return lock

    # -- pop -------------------------------------------------------------------------------------------------
    def pop(self, group: str, topic: str, queue_id: int, max_nums: int, invisible_time: int,
            expression: str = "*", poll_time_ms: int = 0, alive: Callable[[], bool] | None = None) -> PopResult:
        """Pop up to `max_nums` messages; waits up to `poll_time_ms` for one when none is there, and stops
        waiting (pops nothing more) once `alive()` is false: the requester's connection is gone."""
        if poll_time_ms <= 0:
            return self._pop_once(group, topic, queue_id, max_nums, invisible_time, expression)
        deadline = time.monotonic() + poll_time_ms / 1000.0
        reput = self.store.reput_message_service
        woken = threading.Event()
        while True:
            seen = reput.dispatched_offset
            result = self._pop_once(group, topic, queue_id, max_nums, invisible_time, expression)
            if result.count or self._stop.is_set():
                return result
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return result
            woken.clear()
            topics = self.add_arrival_waiter(group, topic, woken)
            try:
                # Records dispatched since the look above came before this pop was counted as waiting, so
                # their pass did not wake it (`_on_arrival` calls nobody when no pop waits): look again
                # at once instead of waiting out the 0.5 s. A pass after this point sees the count and
                # wakes it (the dispatcher moves `dispatched_offset` before it calls the listeners).
                if reput.dispatched_offset == seen and not self._stop.is_set():
                    woken.wait(min(remaining, 0.5))
            finally:
                self.remove_arrival_waiter(topics, woken)
            if alive is not None and not alive():
                return result

    def add_arrival_waiter(self, group: str, topic: str, waker: Any) -> tuple[str, str]:
        """Count a pop of `group` on `topic` as waiting: a dispatched batch of the topic or of its pop retry topic
        calls `waker.set()` (on the dispatching thread, under a lock: it must not block), until
        `remove_arrival_waiter(<the topics returned>, waker)`. `pop` waits on a `threading.Event`; the server's
        POP hold (`BrokerServer._pop_hold`) on its event loop, with no thread per waiting pop."""
        topics = (topic, self._retry_name(group, topic))  # what this pop reads: an arrival there wakes it
        with self._arrival:
            self._arrival_waiting += 1
            for t in topics:
                self._arrival_waiters.setdefault(t, set()).add(waker)
        return topics

    def remove_arrival_waiter(self, topics: tuple[str, str], waker: Any) -> None:
        """Undo `add_arrival_waiter`."""
        with self._arrival:
            self._arrival_waiting -= 1
            for t in topics:
                events = self._arrival_waiters.get(t)
                if events is not None:
                    events.discard(waker)
                    if not events:
                        del self._arrival_waiters[t]

    @property
    def stopped(self) -> bool:
        """The service is shutting down: a waiting pop answers now."""
        return self._stop.is_set()

    def _queues(self, group: str, topic: str, queue_id: int, draw: float | None = None) -> list[tuple[str, int, bool]]:
        if draw is None:
            draw = rng.random()  # one draw per pop: where the queues start, and whether retries go first
        if queue_id >= 0:
            normal = [(topic, queue_id, False)]
        else:  # every read queue, from a random one on (RocketMQ's `randomQ + i`)
            tc = self.broker.topic_manager.get(topic)
            n = tc.read_queue_nums if tc else 0
            first = int(draw * 1_000_003) % n if n > 1 else 0
            queues = self._topic_queues.get((topic, n))
            if queues is None:  # the topic's queues in order, made once (read-only)
                if len(self._topic_queues) >= 4096:
                    self._topic_queues.clear()
                queues = self._topic_queues[(topic, n)] = [(topic, i, False) for i in range(n)]
            normal = queues[first:] + queues[:first] if first else queues
        retry = self._retry_name(group, topic)
        if self.broker.topic_manager.get(retry) is None:
            return normal  # read-only: iterated, never changed
        if draw * 100 < POP_FROM_RETRY_PROBABILITY:  # the queue start above is uniform within this too
            return [(retry, 0, True), *normal]
        return [*normal, (retry, 0, True)]

    def _retry_name(self, group: str, topic: str) -> str:
        retry = self._retry_names.get((group, topic))
        if retry is None:
            if len(self._retry_names) >= 4096:
                self._retry_names.clear()
            retry = self._retry_names[(group, topic)] = pop_retry_topic(group, topic)
        return retry

    def _pop_once(self, group: str, topic: str, queue_id: int, max_nums: int, invisible_time: int,
                  expression: str) -> PopResult:
        pop_time = int(time.time() * 1000)
        revive_qid = self._qid = (self._qid + 1) % REVIVE_QUEUE_NUM
        filt = self._filters.get(expression)
        if filt is None:
            if len(self._filters) >= 256:
                self._filters.clear()
            filt = self._filters[expression] = MessageFilter(expression)
        broker_name = self.broker.config.broker_name
        find_queue = self.store.find_consume_queue
        read = self.store.read_for_pop
        buffer = self.buffer
        bodies: list[bytes] = []
        starts: list[str] = []
        infos: list[str] = []
        count = rest = 0
        for t, q, retry in self._queues(group, topic, queue_id):
            cq = find_queue(t, q, create=False)
            if cq is None:
                continue  # no such queue: nothing to pop, nothing left (the store's answer moves nothing)
            top = cq.get_max_offset_in_queue()
            want = max_nums - count
            if want <= 0:
                if top > 0:  # only counted: the buffer's frontier read without its lock
                    rest += max(top - max(buffer.rest_offset(group, t, q), cq.get_min_offset_in_queue(), 0), 0)
                continue
            if top <= 0:
                continue  # an empty queue (the store's answer would move nothing)
            with self._lock(group, t, q):
                offset = max(buffer.pop_offset(group, t, q), cq.get_min_offset_in_queue(), 0)
                if offset >= top and offset >= cq.get_max_offset_in_queue():
                    continue  # nothing there (the store's answer would move nothing either)
                r = read(t, q, cq, offset, want, filt)  # get_message's answer, as a POP uses it
                if r is None:
                    continue
                status, end, max_offset, n, body, offsets = r
                if not n:
                    if status == GetMessageStatus.OFFSET_TOO_SMALL or end > offset:
                        buffer.add_offset(group, t, q, end)  # skip filtered / removed
                    continue
                # the store hands out each unit from `offset` to `end` at most once, in order: as many
                # records as units means every offset in between (a range, no per-record list)
                ck = PopCheckPoint(offset, pop_time, invisible_time, n, q, t, group, broker_name,
                                   list(range(n)) if offsets.__class__ is range else [o - offset for o in offsets])
                # buffered (or written): the consume offset moves past it by the buffer's rule (pop_buffer.py)
                if not buffer.add_ck(ck, revive_qid, end):
                    continue  # nothing handed out without its checkpoint
            flag = "1" if retry else "0"
            starts.append(f"{flag} {q} {offset}")
            infos.append(f"{flag} {q} {offsets_text(offset, end) if offsets.__class__ is range else ','.join(map(str, offsets))}")
            bodies.append(body)
            count += n
            rest += max(max_offset - end, 0)
        return PopResult(pop_time, invisible_time, revive_qid, bodies, starts, infos, rest, count)

    def _make_pop_offset_ctx(self) -> tuple:
        """`_native.pop_offset`'s context, made once: the buffer's lock, queues and committed-offset read, and the
        ConsumerOffsetFile whose `query_offset` that read is (then read in C), else None."""
        buffer = self.buffer
        file = self.broker.offset_manager.file
        if type(file) is not ConsumerOffsetFile or buffer._committed != file.query_offset:
            file = None
        ctx = self._pop_offset_ctx = (buffer._lock, buffer._queues, buffer._committed, file)
        return ctx

    def pop_now(self, group: str, topic: str, queue_id: int, max_nums: int, invisible_time: int,
                expression: str, read_queue_nums: int | None = None) -> tuple[int, int, int, int, bytes, str, str] | None:
        """`_pop_once` for the common case, flattened: a filter that matches everything (`*`), the buffer
        on with a journal, the store's native pull read. The same look at the same queues in the same
        order, the same checkpoint, journal line, consume offset and response fields as `_pop_once` (the
        reference; tests/test_pop_lane.py compares them), with a fraction of its calls: the queues worth a look
        (`_native.queue_live`), and per queue the bounds, the read and the registration of a contiguous pop with
        its response texts in one C call (`_native.pop_queue`: THE POP READ's pop_read, then THE POP CORE's
        pop_register under the buffer's lock); the buffer's pop offset is its own call. Without those, the same
        lines in Python (the read inlined, `_native.pop_register` for the registration). Returns (pop_time, revive_qid,
        rest_num, count, body, startOffsetInfo, msgOffsetInfo), or None before anything changed when the
        case is not that one (the caller then takes `pop`). Inside the loop, anything unusual (a buffer full,
        an offset outside the queue, a read that found nothing) takes the reference's own call for it.
        `read_queue_nums`: the topic's, when the caller has its config at hand (else `_queues` reads it)."""
        filt = self._filters.get(expression)
        store = self.store
        buffer = self.buffer
        journal = buffer.journal
        impl = codec.pull_native
        if (filt is None or not filt.match_all or journal is None or not buffer.enabled or impl is None
                or store._shutdown or not store._loaded):
            return None
        pop_time = int(time.time() * 1000)
        revive_qid = self._qid = (self._qid + 1) % REVIVE_QUEUE_NUM
        broker_name = self.broker.config.broker_name
        cq_table = store.consume_queue_table
        bqueues = buffer._queues
        blk = buffer._lock
        locks = self._locks
        commit_log = store.commit_log
        cfg = store.config
        mem_ratio = cfg.access_message_in_memory_max_ratio
        total_ram = store._total_ram
        file_span = store._file_span
        pop_queue = _POP_QUEUE
        ctx = None  # pop_queue's arguments for every queue of this pop, made at the first queue read
        bodies: list[bytes] = []
        starts: list[str] = []
        infos: list[str] = []
        count = rest = 0
        first = 0  # the plan is read from there on and round: `plan[first:] + plan[:first]`
        if read_queue_nums is None or queue_id >= 0:
            plan = self._queues(group, topic, queue_id)
        else:  # `_queues` for every read queue, its topic config read by the caller: the same draw, the same order
            draw = rng.random()
            n = read_queue_nums
            first = int(draw * 1_000_003) % n if n > 1 else 0
            plan = self._topic_queues.get((topic, n))
            retry_topic = self._retry_names.get((group, topic))
            if plan is None or retry_topic is None or self.broker.topic_manager.get(retry_topic) is not None:
                plan = self._queues(group, topic, queue_id, draw)
                first = 0
        # the queues the store has that hold something, with their max offset (the others add nothing below)
        live = _QUEUE_LIVE(cq_table, plan, first) if _QUEUE_LIVE is not None else None
        if live is None:
            live = queue_live_py(cq_table, plan, first)
        for t, q, retry, cq, top in live:
            want = max_nums - count
            if want <= 0:
                rest += max(top - max(buffer.rest_offset(group, t, q), cq.get_min_offset_in_queue(), 0), 0)
                continue
            qkey = (group, t, q)
            lock = locks.get(qkey)
            if lock is None:
                lock = self._lock(group, t, q)
            with lock:
                if pop_queue is not None:  # THE POP READ's pop_queue: the bounds, the read and the registration
                    if ctx is None:
                        ctx = (commit_log, MAX_PULL_MSG_SIZE, total_ram, mem_ratio,
                               cfg.max_transfer_bytes_on_message_in_memory, cfg.max_transfer_count_on_message_in_memory,
                               cfg.max_transfer_bytes_on_message_in_disk, cfg.max_transfer_count_on_message_in_disk,
                               buffer, blk, journal, PopCheckPoint, _Entry, deque, buffer._by_key, bqueues, group,
                               pop_time, invisible_time, broker_name, revive_qid)
                    try:
                        got = pop_queue(cq, top, buffer.pop_offset(group, t, q) if _POP_OFFSET is None
                                        else _POP_OFFSET(self._pop_offset_ctx or self._make_pop_offset_ctx(), qkey),
                                        want, t, q, qkey, retry, ctx)
                    except ValueError:
                        if store._shutdown:
                            continue
                        raise
                    if got is None:  # nothing to read there
                        continue
                    if len(got) == 6:  # read and registered (pop_register's journal line and buffer entry)
                        start_item, info_item, body, n, end, max_offset = got
                        starts.append(start_item)
                        infos.append(info_item)
                        bodies.append(body)
                        count += n
                        if max_offset > end:  # rest += max(max_offset - end, 0)
                            rest += max_offset - end
                        continue
                    offset, max_offset, lo = got[0], got[1], got[2]  # not registered: on below (read or not)
                    r = got[3] if len(got) == 4 else None
                else:
                    lo = cq.get_min_offset_in_queue()
                    offset = max(buffer.pop_offset(group, t, q), lo, 0)
                    max_offset = cq.get_max_offset_in_queue()
                    if offset >= top and offset >= max_offset:
                        continue
                    # read_for_pop's native read, inline; anything else is read_for_pop's own
                    r = None
                    if lo <= offset < max_offset and (units := cq.get_units_raw(offset, want)):
                        try:  # store._read_runs, its memory floor (store._mem_floor) inline
                            r = impl.read_runs(
                                units, offset, want, MAX_PULL_MSG_SIZE,
                                commit_log.get_max_offset() - total_ram * mem_ratio // 100,
                                cfg.max_transfer_bytes_on_message_in_memory, cfg.max_transfer_count_on_message_in_memory,
                                cfg.max_transfer_bytes_on_message_in_disk, cfg.max_transfer_count_on_message_in_disk,
                                commit_log.get_min_offset(), file_span)
                        except ValueError:
                            if store._shutdown:
                                continue
                            raise
                if r is not None:
                    status, taken, _total, _max_pulled, body, layout = r
                    n = len(layout) // _RECORD_LAYOUT_SIZE
                    end = offset + taken
                    status = _READ_STATUS[status]
                    offsets: range | list[int] = (range(offset, end) if taken == n else
                                                  [o for o, _, _ in _RECORD_LAYOUT.iter_unpack(layout)])
                else:
                    got = store.read_for_pop(t, q, cq, offset, want, filt)
                    if got is None:
                        continue
                    status, end, max_offset, n, body, offsets = got
                if not n:
                    if status == GetMessageStatus.OFFSET_TOO_SMALL or end > offset:
                        buffer.add_offset(group, t, q, end)
                    continue
                contiguous = offsets.__class__ is range
                texts = None  # (startOffsetInfo item, msgOffsetInfo item) once registered in C
                if contiguous and _POP_REGISTER is not None:  # the block below in C (THE POP CORE in _native.c)
                    with blk:
                        if buffer.enabled and buffer._count < buffer.max_size:
                            got = _POP_REGISTER(PopCheckPoint, _Entry, deque, buffer._by_key, bqueues, qkey,
                                                journal._fd, group, t, q, offset, end, pop_time, invisible_time,
                                                broker_name, revive_qid, buffer.stay_ms, buffer.margin_ms, retry)
                            if got is not None:
                                journal.size += got[0]
                                buffer._count += 1
                                if got[1]:
                                    buffer._scan_commit(qkey)
                                texts = got[2], got[3]
                if texts is None:
                    ck = PopCheckPoint(offset, pop_time, invisible_time, n, q, t, group, broker_name,
                                       list(range(n)) if contiguous else [o - offset for o in offsets])
                    added = False
                    with blk:  # buffer.add_ck, buffered: the entry, its journal line, its queue
                        if buffer.enabled and buffer._count < buffer.max_size:
                            flush_at = pop_time + max(min(buffer.stay_ms, invisible_time - buffer.margin_ms), 0)
                            entry = _Entry(ck, revive_qid, end, flush_at)
                            journal.ck(ck, revive_qid, end, entry.contiguous)
                            buffer._by_key[(group, t, q, offset, pop_time)] = entry
                            bq = bqueues.get(qkey)
                            if bq is None:
                                bq = bqueues[qkey] = deque()
                            bq.append(entry)
                            buffer._count += 1
                            first = bq[0]
                            if first.stored or first.acked == first.full:
                                buffer._scan_commit(qkey)
                            added = True
                    if not added and not buffer.add_ck(ck, revive_qid, end):  # full: written now, as add_ck does
                        continue
            if texts is None:
                flag = "1" if retry else "0"
                texts = (f"{flag} {q} {offset}",
                         f"{flag} {q} {offsets_text(offset, end) if contiguous else ','.join(map(str, offsets))}")
            starts.append(texts[0])
            infos.append(texts[1])
            bodies.append(body)
            count += n
            rest += max(max_offset - end, 0)
        return (pop_time, revive_qid, rest, count, bodies[0] if len(bodies) == 1 else b"".join(bodies),
                ";".join(starts), ";".join(infos))

    def _put_revive(self, body: str, tag: str, qid: int) -> bool:
        msg = Message(self.revive_topic, body.encode(), tags=tag, queue_id=qid)
        msg.properties_string = f"TAGS\x01{tag}\x02WAIT\x01true\x02"
        r = self.store.put_message(msg)
        if not r.is_ok():
            log.error("revive record not written (%s): %s %s", tag, r.status.name, r.reason or "")
        return r.is_ok()

    # -- ack and change invisible time ------------------------------------------------------------------------
    def ack(self, group: str, topic: str, extra: ExtraInfo, offset: int) -> bool:
        """Settle one popped message (its receipt handle `extra`)."""
        if self.buffer.ack((group, topic, extra.queue_id, extra.ck_queue_offset, extra.pop_time),
                           range(offset, offset + 1)):
            return True  # matched in the buffer: nothing to write
        ack = AckMsg(offset, extra.ck_queue_offset, group, topic, extra.queue_id, extra.pop_time,
                     extra.broker_name)
        return self._put_revive(ack.to_json(), ACK_TAG, extra.revive_qid)

    def batch_ack(self, ack: BatchAck) -> bool:
        """Settle several messages of one pop: in the buffer, or with one revive record (tag `bAck`, ack
        offset list `aol`)."""
        bits, start = ack.bits, ack.start_offset
        if bits and bits[-1] - bits[0] == len(bits) - 1 and bits == list(range(bits[0], bits[-1] + 1)):
            offsets: list[int] | range = range(start + bits[0], start + bits[-1] + 1)  # the usual: no gap
        else:
            offsets = [start + b for b in bits]
        if self.buffer.ack((ack.group, ack.topic, ack.queue_id, start, ack.pop_time), offsets):
            return True
        offsets = list(offsets)
        body = json.dumps({"aol": offsets, "so": ack.start_offset, "c": ack.group,
                           "t": ack.topic, "q": ack.queue_id, "pt": ack.pop_time,
                           "bn": self.broker.config.broker_name}, separators=(",", ":"))
        return self._put_revive(body, BATCH_ACK_TAG, ack.revive_qid)

    def change_invisible_time(self, group: str, topic: str, extra: ExtraInfo, offset: int,
                              invisible_time: int) -> ExtraInfo | None:
        """A new checkpoint for the message (due `invisible_time` ms from now), then the old one acked;
        the new receipt handle, or None when the checkpoint could not be written."""
        # a checkpoint is known by (group, topic, queue, start offset, pop time): the new one must not share
        # the old one's key, or the ack of the old one would settle it
        pop_time = max(int(time.time() * 1000), extra.pop_time + 1)
        # the old checkpoint (and the queue's earlier ones) go to the revive topic first: the new one's end
        # must not carry the offset past them at a recovery
        self.buffer.flush_queue(group, topic, extra.queue_id)
        ck = PopCheckPoint(offset, pop_time, invisible_time, 1, extra.queue_id, topic, group,
                           self.broker.config.broker_name, [0])
        if not self._put_revive(ck.to_json(), CK_TAG, extra.revive_qid):
            return None
        self.ack(group, topic, extra, offset)
        return ExtraInfo(offset, pop_time, invisible_time, extra.revive_qid, extra.retry, extra.broker_name,
                         extra.queue_id, offset)

    # -- revive -------------------------------------------------------------------------------------------------
    def _revive_loop(self) -> None:
        while not self._stop.wait(REVIVE_INTERVAL):
            try:
                self.revive_once()
            except Exception:
                log.exception("revive round failed")

    def revive_once(self, now_ms: int | None = None) -> int:
        """One round over the revive queues; how many messages were put back."""
        now = int(time.time() * 1000) if now_ms is None else now_ms
        self.buffer.flush_due(now)
        n = 0
        for qid in range(REVIVE_QUEUE_NUM):
            n += self._revive_queue(qid, now)
        if n:  # what was put back is recorded at once, so a crash does not put it back twice
            self.broker.offset_manager.persist()
        return n

    def forget_topic(self, topic: str) -> int:
        """`topic` was deleted: drop its pending checkpoints and its pops in the checkpoint buffer (RocketMQ
        clears the topic's in-flight counts and its revive skips checkpoints of a topic without config), so
        nothing of it is put back, not even into a topic of the same name created later; checkpoints of it
        read later are void too. Returns how many checkpoints went."""
        now = int(time.time() * 1000)
        n = 0
        with self._revive_lock:
            if len(self._deleted_at) > self._deleted_limit:  # pruned when it doubled: amortised O(1)
                day = now - 86_400_000
                self._deleted_at = {t: at for t, at in self._deleted_at.items() if at > day}
                self._deleted_limit = max(1024, 2 * len(self._deleted_at))
            self._deleted_at[topic] = now
            for pending in self._pending.values():
                for key in [k for k in pending if k[1] == topic]:
                    del pending[key]
                    n += 1
        n += self.buffer.forget_topic(topic)
        with self._locks_guard:
            for key in [k for k in self._locks if k[1] == topic]:
                del self._locks[key]
        return n

    def _void(self, ck: PopCheckPoint) -> bool:
        """A checkpoint of a deleted topic: nothing to put back."""
        at = self._deleted_at.get(ck.topic)
        return (at is not None and ck.pop_time <= at) or self.broker.topic_manager.get(ck.topic) is None

    def _revive_queue(self, qid: int, now: int) -> int:
        with self._revive_lock:
            return self._revive_queue_locked(qid, now)

    def _revive_queue_locked(self, qid: int, now: int) -> int:
        offsets = self.broker.offset_manager
        pending = self._pending.setdefault(qid, OrderedDict())
        due = self._due.setdefault(qid, [])
        if qid not in self._read:
            self._read[qid] = max(offsets.file.query_offset(REVIVE_GROUP, self.revive_topic, qid), 0)
        while True:
            r = self.store.get_message(REVIVE_GROUP, self.revive_topic, qid, self._read[qid], 256, None)
            if r is None or not r.messages:
                break
            for m in r.messages:
                self._read[qid] = m.queue_offset + 1
                try:
                    if m.tags == CK_TAG:
                        ck = PopCheckPoint.from_json(bytes(m.body))
                        key = (ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time)
                        pending[key] = (ck, m.queue_offset)
                        pending.move_to_end(key)  # kept in revive-topic order: the first is the oldest position
                        heapq.heappush(due, (ck.revive_time, next(self._due_seq), key, ck))
                    elif m.tags == ACK_TAG:
                        ack = AckMsg.from_json(bytes(m.body))
                        self._mark(pending, (ack.group, ack.topic, ack.queue_id, ack.start_offset, ack.pop_time),
                                   [ack.ack_offset])
                    elif m.tags == BATCH_ACK_TAG:
                        d = json.loads(bytes(m.body))
                        self._mark(pending, (str(d["c"]), str(d["t"]), int(d["q"]), int(d["so"]), int(d["pt"])),
                                   [int(x) for x in d["aol"]])
                except (ValueError, KeyError) as e:
                    log.warning("revive queue %d offset %d: unreadable record skipped (%s)", qid, m.queue_offset, e)
        n = 0
        retry: list[tuple[int, int, tuple, PopCheckPoint]] = []
        while due and due[0][0] <= now:  # the due ones, by revive time; O(due · log pending), not O(pending)
            item = heapq.heappop(due)
            key, ck = item[2], item[3]
            entry = pending.get(key)
            if entry is None or entry[0] is not ck:  # acked, dropped or read again since: stale
                continue
            if self._void(ck):
                log.info("revive: %s was deleted, checkpoint of queue %d offset %d dropped", ck.topic, ck.queue_id,
                         ck.start_offset)
                del pending[key]
                continue
            failed = False
            for i, off in enumerate(ck.offsets()):
                if ck.bit_map & (1 << i):
                    continue
                done = self._put_back(ck, off)
                if done is None:
                    failed = True  # kept, and tried again next round (RocketMQ rewrites the checkpoint)
                    continue
                ck.bit_map |= 1 << i
                n += done
            if not failed:
                del pending[key]
            else:
                retry.append(item)
        for item in retry:
            heapq.heappush(due, item)
        if len(due) > 2 * len(pending) + 1024:  # stale items (acked checkpoints) outnumber live ones: rebuild
            due[:] = [item for item in due if (e := pending.get(item[2])) is not None and e[0] is item[3]]
            heapq.heapify(due)
        settled = next(iter(pending.values()))[1] if pending else self._read[qid]
        if settled > offsets.file.query_offset(REVIVE_GROUP, self.revive_topic, qid):
            offsets.commit(REVIVE_GROUP, self.revive_topic, qid, settled)
        self.revived += n
        return n

    @staticmethod
    def _mark(pending: OrderedDict, key: tuple, offsets: list[int]) -> None:
        """Set the acked bits of the pending checkpoint `key`; a fully acked one is settled."""
        entry = pending.get(key)
        if entry is None:
            return
        ck = entry[0]
        for off in offsets:
            diff = off - ck.start_offset
            if diff in ck.queue_offset_diff:
                ck.bit_map |= 1 << ck.queue_offset_diff.index(diff)
        if ck.bit_map == (1 << len(ck.queue_offset_diff)) - 1:
            del pending[key]

    def _put_back(self, ck: PopCheckPoint, offset: int) -> bool | None:
        """An unacked message of `ck` goes to the pop retry topic (or the DLQ past the group's maximum): True
        when put back, False when the message is gone (nothing to put back), None when the put failed."""
        phy = self.store.get_commit_log_offset_in_queue(ck.topic, ck.queue_id, offset)
        msg = self.store.look_message_by_offset(phy) if phy >= 0 else None
        if msg is None:
            log.warning("revive: %s queue %d offset %d is gone", ck.topic, ck.queue_id, offset)
            return False
        props = msg.properties_string
        origin = get_property(props, PROPERTY_RETRY_TOPIC) or ck.topic
        if get_property(props, PROPERTY_RETRY_TOPIC) is None:
            props = set_property(props, PROPERTY_RETRY_TOPIC, ck.topic)
        if get_property(props, PROPERTY_FIRST_POP_TIME) is None:
            props = set_property(props, PROPERTY_FIRST_POP_TIME, str(ck.pop_time))
        if get_property(props, PROPERTY_ORIGIN_MESSAGE_ID) is None:
            props = set_property(props, PROPERTY_ORIGIN_MESSAGE_ID, msg.uniq_key or msg.msg_id)
        sg = self.broker.group_manager.find(ck.group)
        limit = sg.retry_max_times if sg is not None else 16
        reconsume = msg.reconsume_times + 1
        if reconsume > limit:
            topic = DLQ_GROUP_TOPIC_PREFIX + ck.group
        else:
            topic = pop_retry_topic(ck.group, origin)
        self.broker.topic_manager.ensure(topic, 1)
        out = Message(topic=topic, body=bytes(msg.body), queue_id=0, flag=msg.flag, properties_string=props,
                      sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                      reconsume_times=reconsume)
        r = self.store.put_message(out)
        if not r.is_ok():
            log.error("revive: could not put back %s: %s (tried again next round)", msg.uniq_key, r.status.name)
            return None
        return True

    def pending_count(self) -> int:
        return sum(len(p) for p in self._pending.values())
