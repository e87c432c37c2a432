"""`ClusterConsumer`: RocketMQ's clustering consumption from the client's side (`DefaultMQPushConsumer` with
`RebalanceImpl`, `AllocateMessageQueueAveragely` and the orderly consume service), for event handlers.

The queues of the subscribed topics are divided among the group's live members (the broker's consumer list,
sorted, as `AllocateMessageQueueAveragely` divides them); a member joining or leaving makes the broker send
NOTIFY_CONSUMER_IDS_CHANGED and every member rebalances at once (and every `rebalance_interval` seconds
anyway). Each queue this member holds is read by one thread, in order, with long polling; the handler is
called for one message at a time, and the queue's offset is committed to the broker (consumerOffset.json)
after the messages before it were handled. A handler that raises is retried in place with backoff (the
queue waits: per-queue order is kept); after `max_retries` the message goes to the group's DLQ
(`%DLQ%<group>`) and the queue moves on. At-least-once: a crash, or a queue changing hands, can deliver
the messages handled since the last commit again, so handlers should be idempotent (the message id is a
natural key).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..common import MessageExt
from ..common.topic import validate_group, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from .base import loads_body
from .consumer import FOUND, NO_MATCHED_MSG, NO_NEW_MSG, OFFSET_ILLEGAL, PullConsumer, _ConsumerBase
from .remoting_client import RemotingError

log = logging.getLogger(__name__)

Handler = Callable[[MessageExt], None]


def allocate_averagely(queues: list[tuple[str, int]], consumer_ids: list[str], me: str) -> list[tuple[str, int]]:
    """RocketMQ's `AllocateMessageQueueAveragely`: with the queues and the consumer ids sorted, consumer `i`
    takes a consecutive run; the first `len(queues) % len(consumers)` take one queue more, and consumers
    beyond the number of queues take none."""
    queues = sorted(queues)
    cids = sorted(consumer_ids)
    if me not in cids or not queues:
        return []
    index, n, m = cids.index(me), len(queues), len(cids)
    mod = n % m
    if n <= m:
        size = 1
    else:
        size = n // m + 1 if mod > 0 and index < mod else n // m
    start = index * size if mod > 0 and index < mod else index * size + mod
    return queues[start:start + max(0, min(size, n - start))]


@dataclass
class _QueueWorker:
    topic: str
    queue_id: int
    thread: threading.Thread | None = None
    stop: threading.Event = field(default_factory=threading.Event)
    offset: int = -1
    committed: int = -1


class _ClusterBase(_ConsumerBase):
    def _on_server_request(self, address: str, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.NOTIFY_CONSUMER_IDS_CHANGED:
            owner = getattr(self.consumer, "_cluster", None)
            if owner is not None:
                owner.request_rebalance()


class _Puller(PullConsumer):
    """The `PullConsumer` a `ClusterConsumer` pulls with: listens to NOTIFY_CONSUMER_IDS_CHANGED."""

    def _make_base(self, namesrv_addr: str, timeout: float, access_key: str | None,
                   secret_key: str | None) -> _ConsumerBase:
        return _ClusterBase(namesrv_addr, self, timeout, access_key, secret_key)


class ClusterConsumer:
    """One member of a clustering consumer group calling `handler` for each message of its queues (see the
    module docstring); thread-safe, `start()`/`shutdown()` or a context manager."""

    def __init__(self, namesrv_addr: str, group: str, handler: Handler, subscriptions: dict[str, str], *,
                 consume_from: str = "first", batch_size: int = 32, max_retries: int = 16,
                 retry_backoff: tuple[float, float] = (0.1, 10.0), rebalance_interval: float = 20.0,
                 poll_timeout_ms: int = 15_000, timeout_ms: int = 3000, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        validate_group(group)
        if not subscriptions:
            raise ValueError("a ClusterConsumer needs at least one topic")
        for topic in subscriptions:
            validate_topic(topic)
        if consume_from not in ("first", "last"):
            raise ValueError("consume_from is 'first' (replay the topic) or 'last' (only new messages)")
        self.group = group
        self.handler = handler
        self.subscriptions = dict(subscriptions)
        self.consume_from = consume_from
        self.batch_size = batch_size
        self.max_retries = max_retries
        self.retry_backoff = retry_backoff
        self.rebalance_interval = rebalance_interval
        self.poll_timeout_ms = poll_timeout_ms
        self._pull = _Puller(namesrv_addr, group, timeout_ms, "CLUSTERING", access_key, secret_key)
        self._pull._cluster = self  # type: ignore[attr-defined]
        self._workers: dict[tuple[str, int], _QueueWorker] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._rebalance_now = threading.Event()
        self._rebalancer: threading.Thread | None = None
        self.handled = 0

    @property
    def client_id(self) -> str:
        return self._pull.client_id

    # lifecycle
    def start(self) -> ClusterConsumer:
        self._pull.start()
        for topic, expression in self.subscriptions.items():
            self._pull.subscribe(topic, expression)
        self.rebalance()
        self._rebalancer = threading.Thread(target=self._rebalance_loop, name=f"rebalance-{self.group}", daemon=True)
        self._rebalancer.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the queue threads (a handler running finishes its message), commit every queue's offset,
        leave the group (the other members rebalance)."""
        self._stop.set()
        self._rebalance_now.set()
        if self._rebalancer is not None and self._rebalancer is not threading.current_thread():
            self._rebalancer.join(timeout)
        with self._lock:
            workers = list(self._workers.values())
            self._workers.clear()
        for w in workers:
            w.stop.set()
        deadline = time.monotonic() + min(timeout, 2.0)  # handlers finish; long polls are cut below
        for w in workers:
            if w.thread is not None:
                w.thread.join(max(0.0, deadline - time.monotonic()))
        for w in workers:
            self._commit_quietly(w)
        self._pull.shutdown()
        for w in workers:
            if w.thread is not None:
                w.thread.join(max(0.0, deadline + timeout - time.monotonic()))

    def __enter__(self) -> ClusterConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # rebalance
    def request_rebalance(self) -> None:
        self._rebalance_now.set()

    def assigned(self) -> set[tuple[str, int]]:
        with self._lock:
            return set(self._workers)

    def _rebalance_loop(self) -> None:
        while not self._stop.is_set():
            self._rebalance_now.wait(self.rebalance_interval)
            self._rebalance_now.clear()
            if self._stop.is_set():
                return
            try:
                self.rebalance()
            except Exception:
                log.warning("rebalance of %s failed; trying again", self.group, exc_info=True)
                time.sleep(1.0)
                self._rebalance_now.set()

    def consumer_ids(self, topic: str) -> list[str]:
        base = self._pull._base
        r = base.invoke(base.broker_for(topic), RemotingCommand.request(
            RequestCode.GET_CONSUMER_LIST_BY_GROUP, {"consumerGroup": self.group}))
        return list(loads_body(r.body).get("consumerIdList") or []) if r.code == ResponseCode.SUCCESS else []

    def rebalance(self) -> None:
        """Take the queues `allocate_averagely` gives this member now; let go of the others."""
        wanted: set[tuple[str, int]] = set()
        for topic in self.subscriptions:
            route = self._pull._base.route(topic, refresh=True)
            queues = sorted({(addr, q) for addr, q in route.read_queues})
            cids = self.consumer_ids(topic)
            if self.client_id not in cids:  # not registered yet (a heartbeat is on its way)
                self._pull._base.send_heartbeat()
                cids = self.consumer_ids(topic)
            wanted |= {(topic, q) for _, q in allocate_averagely(queues, cids, self.client_id)}
        with self._lock:
            if self._stop.is_set():
                return
            gone = [w for key, w in self._workers.items() if key not in wanted]
            for w in gone:
                del self._workers[(w.topic, w.queue_id)]
            new = [key for key in wanted if key not in self._workers]
            for topic, q in new:
                w = _QueueWorker(topic, q)
                self._workers[(topic, q)] = w
                w.thread = threading.Thread(target=self._consume, args=(w,), name=f"{self.group}-{topic}-{q}",
                                            daemon=True)
                w.thread.start()
        if gone:
            self._stop_workers(gone, 10.0)
        if gone or new:
            log.info("%s %s: queues %s (released %s)", self.group, self.client_id, sorted(wanted),
                     sorted((w.topic, w.queue_id) for w in gone))

    def _stop_workers(self, workers: list[_QueueWorker], timeout: float) -> None:
        for w in workers:
            w.stop.set()
        deadline = time.monotonic() + timeout
        for w in workers:
            if w.thread is not None and w.thread is not threading.current_thread():
                w.thread.join(max(0.0, deadline - time.monotonic()))

    # consumption
    def _start_offset(self, w: _QueueWorker) -> int:
        offset = self._pull.fetch_offset(w.topic, w.queue_id)
        if offset >= 0:
            return offset
        base = self._pull._base
        code = RequestCode.GET_MIN_OFFSET if self.consume_from == "first" else RequestCode.GET_MAX_OFFSET
        r = base.invoke(base.broker_for(w.topic), RemotingCommand.request(code, {"topic": w.topic, "queueId": w.queue_id}))
        return int(r.ext_fields.get("offset", 0))

    def _commit(self, w: _QueueWorker) -> None:
        if w.offset > w.committed:
            self._pull.commit_offset(w.topic, w.queue_id, w.offset)
            w.committed = w.offset

    def _consume(self, w: _QueueWorker) -> None:
        expression = self.subscriptions[w.topic]
        while not w.stop.is_set():
            try:
                if w.offset < 0:
                    w.offset = self._start_offset(w)
                    w.committed = w.offset
                r = self._pull.pull(w.topic, w.queue_id, w.offset, self.batch_size,
                                    self.poll_timeout_ms if not w.stop.is_set() else 0, expression)
            except RemotingError as e:
                if w.stop.is_set():
                    break
                log.warning("pull of %s-%d for %s failed: %s", w.topic, w.queue_id, self.group, e)
                w.stop.wait(1.0)
                continue
            if w.stop.is_set():
                # released while the pull was held (a rebalance gave the queue to another member, which
                # starts at the committed offset): drop what it brought, as RocketMQ drops the result of a
                # pull whose process queue was dropped, so nothing is handled twice for that reason
                break
            if r.status == OFFSET_ILLEGAL:
                w.offset = max(min(w.offset, r.max_offset), r.min_offset)
                continue
            if r.status in (NO_NEW_MSG, NO_MATCHED_MSG) or (r.status == FOUND and not r.messages):
                if r.next_begin_offset > w.offset:
                    w.offset = r.next_begin_offset
                    self._commit_quietly(w)
                continue
            for m in r.messages:
                if w.stop.is_set() or not self._handle(w, m):
                    break  # stopping: the unhandled rest comes again to whoever holds the queue next
                w.offset = m.queue_offset + 1
            else:
                w.offset = max(w.offset, r.next_begin_offset)
            self._commit_quietly(w)
        self._commit_quietly(w)

    def _commit_quietly(self, w: _QueueWorker) -> None:
        try:
            self._commit(w)
        except RemotingError as e:
            if self._stop.is_set():
                return
            log.warning("offset commit of %s-%d for %s failed: %s", w.topic, w.queue_id, self.group, e)

    def _handle(self, w: _QueueWorker, m: MessageExt) -> bool:
        """Run the handler until it succeeds, the retries are spent (then the DLQ), or the worker stops."""
        delay, attempt = self.retry_backoff[0], 0
        while True:
            try:
                self.handler(m)
                self.handled += 1
                return True
            except Exception:
                attempt += 1
                log.exception("handler of %s failed on %s (attempt %d of %d)", self.group,
                              m.uniq_key or m.msg_id, attempt, self.max_retries + 1)
                if attempt > self.max_retries:
                    try:
                        self._pull.send_back(m, delay_level=-1)  # straight to %DLQ%<group>
                        return True
                    except RemotingError as e:
                        log.warning("could not move %s to the DLQ: %s", m.uniq_key or m.msg_id, e)
                if w.stop.wait(delay):
                    return False
                delay = min(delay * 2, self.retry_backoff[1])
