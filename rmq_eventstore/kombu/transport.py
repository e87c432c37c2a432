"""kombu virtual transport on RocketMQ 5's POP / ACK (`rocketmq://host:9876//`, `rocketmq:///path/to/store`).

- A kombu queue is a topic (`names.topic_name`), consumed by one POP consumer group (`kombu`, or
  `<namespace>%kombu`). Delivery is POP with the `visibility_timeout` (seconds, default 3600 as Redis) as
  invisible time; ack is ACK; reject with requeue, `basic_recover` and restore on close change the
  invisible time to zero (the same message comes back, no copy is sent). Acks are sent in batches
  (BATCH_ACK_MESSAGE) by a background thread per connection (`_AckBatcher`), so a worker does not wait for
  a round trip per task; closing the connection waits for them. Nothing about unacked messages
  is kept in memory only: a worker that dies holding messages loses nothing, the broker's revive puts them
  back once their invisible time is over.
- The delivery tag is `<topic>/<receipt handle>`: unique per delivery, and all an ACK needs, so acks from
  other threads need no lookup.
- Exchanges, bindings and queue declarations live in the broker as a log (`bindings.SharedState`), so
  direct, topic and fanout routing work across processes; everything uses RocketMQ's protocol only.
- Priorities: a queue declared with `x-max-priority` (`Queue(max_priority=…)`) gets 10 queues (lanes)
  in its topic; priority p (0..9, higher first, as AMQP) is sent to lane p and lanes are popped from 9
  down. Other queues have one lane and ignore priorities (as RabbitMQ does).
- Prefetch is exact: a channel never holds (delivered and unacked, plus asked for in POPs under way)
  more than its `basic_qos` prefetch count.
- Asynchronous (`implements.asynchronous`): on kombu's hub (Celery's asynloop) POP long polls run on pool
  threads and wake the hub through a socket pair registered as a reader; `drain_events` stays for users
  without a hub. See `Transport.register_with_event_loop`.
- TTL: a message's `expiration` and a queue's `x-message-ttl` are checked when it is popped; expired
  messages are acked and dropped.
- ETA / countdown (transport option `eta_timers`, on by default): a Celery task with an eta (protocol 2's
  `eta` header, or protocol 1's body) is sent as a RocketMQ timer message due `eta_lead` seconds before its
  eta, so the broker holds it, not a worker: no worker keeps it in memory for hours, none sees it redelivered
  by the visibility timeout, a worker restart loses nothing. The worker still gets Celery's message with its
  eta and waits out the lead. A `deliver_at` message property (epoch seconds) is the same without lead.
  Farther than the broker's `timerMaxDelaySec` (`eta_max_delay`), a message is chained: sent due at the
  maximum, and the transport that pops that hop sends the next one (first) and acks the hop (then).
"""

from __future__ import annotations

import atexit
import base64
import concurrent.futures
import difflib
import json
import logging
import os
import re
import socket
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable
from datetime import datetime
from itertools import count
from queue import Empty
from typing import Any

from kombu.exceptions import ChannelError
from kombu.transport import virtual
from kombu.transport.base import to_rabbitmq_queue_arguments

from .. import __version__
from ..client import (
    Admin,
    LocalBrokerError,
    Message,
    MQBrokerError,
    PopConsumer,
    Producer,
    PullConsumer,
    RemotingError,
    ensure_local_broker,
    find_local_broker,
)
from ..client.consumer import FOUND, OFFSET_ILLEGAL
from ..common import codec
from ..common.pop import ExtraInfo, pop_retry_topic
from ..common.properties import PROPERTY_POP_CK, PROPERTY_TIMER_DELIVER_MS
from ..common.topic import RMQ_SYS_WHEEL_TIMER_TOPIC, TopicValidationError
from ..remoting import ResponseCode
from .bindings import SharedState
from .names import queue_name, system_topic, topic_name, validate_namespace

log = logging.getLogger(__name__)

DEFAULT_PORT = 9876
LANES = 10  # queues of a priority queue's topic: priorities 0..9
DEFAULT_VISIBILITY_TIMEOUT = 3600.0
DEFAULT_BATCH = 32  # messages asked for per POP when the channel's prefetch is unlimited
DEFAULT_MAX_POLL = 1.0  # longest POP long poll (s) while waiting on several queues at once
DEFAULT_REQUEUE_WAIT = 2.0  # how long a get waits for a message this channel requeued to come back (s)
DEFAULT_PUBLISH_WAIT = 1.0  # how long a get waits for a message this connection just sent to be readable (s)
DEFAULT_SWEEP_INTERVAL = 5.0  # seconds between two looks for x-expires queues unused for too long
DEFAULT_RETRY_MAX_TIMES = 10_000  # redeliveries before RocketMQ moves a message to %DLQ%<group>
_TIMER_MAX_DELAY = 259_200.0  # RocketMQ's timerMaxDelaySec default: farther timers are chained (hops)
DEFAULT_ETA_LEAD = 1.5  # s before its eta a task is delivered: a timer tick's rounding, and a margin
TIMER_TICK = 1.0  # RocketMQ's timerPrecisionMs default (s): nearer than this, a timer is not worth it
HOP_RETRY = 5.0  # s after which a hop that could not be sent on comes back to be tried again
FORWARD_THREADS = 4  # hops of tasks sent together come due together: send them on in parallel
PROPERTY_EXPIRE_AT = "KOMBU_EXPIRE_AT"
PROPERTY_DUE_AT = "KOMBU_DUE_AT"  # epoch ms when a timer-sent message is due at the consumer (chains' last hop)
_MAX_DELAY_RE = re.compile(r"timerMaxDelaySec (\d+)")
# json.dumps(message, separators=(",", ":")) makes a JSONEncoder per call; this one encoder (the same options:
# ensure_ascii, check_circular, allow_nan, no sort) writes the same text and is shared (encode keeps no state)
_MESSAGE_JSON = json.JSONEncoder(separators=(",", ":")).encode
# _MESSAGE_JSON(message).encode() in one C pass (THE KOMBU JSON): bytes, or None when the message holds a type it
# leaves to json (then _MESSAGE_JSON writes it); None without the extension or under RMQ_EVENTSTORE_PURE=1
_message_json_bytes = getattr(codec.native, "kombu_json", None)
_QUEUE_TOPICS_MAX = 4096  # queue -> topic names a connection remembers (then it starts over: reply queues)


# the transport options this transport reads (`Transport.__init__`, `Channel.from_transport_options`), and the
# ones kombu itself reads from the same dict (`Connection._extract_failover_opts`, a publish's retry policy that
# `Producer.publish` copies in, `virtual.Transport`'s polling_interval)
OWN_OPTIONS = frozenset({
    "namespace", "group", "max_poll", "retry_max_times", "broker_options", "expiry_sweep_interval", "eta_timers",
    "eta_lead", "eta_max_delay", "restore_on_connection_loss", "ack_batching", "visibility_timeout", "batch_size",
    "requeue_wait", "publish_wait", "body_encoding", "deadletter_queue", "polling_interval"})
KOMBU_OPTIONS = frozenset({"max_retries", "interval_start", "interval_step", "interval_max",
                           "connect_retries_timeout", "errback", "callback", "retry_errors", "timeout"})
_warned_options: set[frozenset[str]] = set()


def _warn_unknown_options(opts: dict[str, Any]) -> None:
    """Warn once per process about transport options this transport does not read (a typo, or another
    broker's option kept from a migration: Redis's `fanout_prefix`, `global_keyprefix`...), which kombu would
    otherwise ignore in silence (celery/celery#7651: "visibility_timeout doesn't work")."""
    unknown = frozenset(str(k) for k in opts) - OWN_OPTIONS - KOMBU_OPTIONS
    if not unknown or unknown in _warned_options:
        return
    _warned_options.add(unknown)
    hints = []
    for name in sorted(unknown):
        near = difflib.get_close_matches(name, OWN_OPTIONS, 1, 0.8)
        hints.append(f"{name} (did you mean {near[0]}?)" if near else name)
    log.warning("kombu: transport options the rocketmq transport does not read, ignored: %s; it reads %s",
                ", ".join(hints), ", ".join(sorted(OWN_OPTIONS)))


def _hop_key(m: Any) -> str | None:
    """The KEYS of the hop sent on from the popped hop `m`: named after `m`'s message id (its UNIQ_KEY, which
    a pop retry keeps), so the broker's index tells whether it was sent already (`Channel._hop_sent`)."""
    uniq = m.properties.get("UNIQ_KEY")
    return f"kombu-hop-{uniq}" if uniq else None


def _as_bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() not in ("", "0", "false", "no", "off")
    return bool(value)


def celery_eta(message: dict[str, Any]) -> float | None:
    """The eta (epoch seconds) of a Celery task message as kombu hands it to `_put`: protocol 2's `eta`
    header (ISO 8601, with or without an offset: a naive one is local time, as `datetime.timestamp` reads
    it), or protocol 1's `eta` field of a JSON body; None when it has none (or it cannot be read)."""
    headers = message.get("headers") or {}
    eta = headers.get("eta")
    if eta is None and "task" not in headers:  # protocol 1: everything is in the body
        props = message.get("properties") or {}
        if "json" not in str(message.get("content-type") or props.get("content_type") or ""):
            return None
        try:
            body = message.get("body")
            if props.get("body_encoding") == "base64":
                body = base64.b64decode(body)
            doc = json.loads(body)
            eta = doc.get("eta") if isinstance(doc, dict) else None
        except (TypeError, ValueError):
            return None
    if not eta:
        return None
    try:
        return datetime.fromisoformat(str(eta)).timestamp()
    except (TypeError, ValueError, OverflowError):
        return None

__all__ = ["Channel", "QoS", "Transport"]


class _Receipt:
    """What `PopConsumer.ack` / `change_invisible_time` need of a popped message: topic and handle."""

    __slots__ = ("topic", "properties")

    def __init__(self, topic: str, handle: str) -> None:
        self.topic = topic
        self.properties = {PROPERTY_POP_CK: handle}


def _receipt(delivery_tag: str) -> _Receipt:
    topic, _, handle = str(delivery_tag).partition("/")
    if not handle:
        raise ValueError(f"{delivery_tag!r} is not a delivery tag of this transport")
    return _Receipt(topic, handle)


def _clamp_priority(message: dict[str, Any]) -> int:
    try:
        return max(0, min(int(message["properties"]["priority"]), LANES - 1))
    except (TypeError, ValueError, KeyError):
        return 0


_settlers: dict[tuple[str, str, str | None, str | None], PopConsumer] = {}
_settlers_lock = threading.Lock()


def _settler(namesrv: str, group: str, access_key: str | None, secret_key: str | None) -> PopConsumer:
    """A process-wide POP consumer of `group` that settles (acks, rejects, gives back) messages delivered on
    a connection closed since: Celery replaces its connection after a loss, while tasks delivered on the
    old one still run and ack later. Receipt handles belong to the broker, not to a connection, so any
    connection of the group can settle them. One per name server and group, not one per reconnect."""
    key = (namesrv, group, access_key, secret_key)
    with _settlers_lock:
        c = _settlers.get(key)
        if c is None:
            c = _settlers[key] = PopConsumer(namesrv, group, access_key=access_key, secret_key=secret_key).start()
        return c


def _shutdown_settlers() -> None:
    with _settlers_lock:
        settlers = list(_settlers.values())
        _settlers.clear()
    for c in settlers:
        try:
            c.shutdown()
        except Exception:  # pragma: no cover - best effort at exit
            pass


class _AckRetry:
    """Acks that failed because the broker could not be reached, sent again in the background until they land
    or their lease is over (after that the message has come back anyway, and acking the old receipt is
    void). An ack is idempotent, so a retry of one that did land changes nothing. A broker back within the
    lease thus settles a task that finished while it was away: it does not run twice."""

    INTERVAL = 0.5  # seconds between rounds

    def __init__(self) -> None:
        self._pending: list[tuple[Any, _Receipt, float]] = []  # (pop consumer getter, receipt, give up at)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, getter: Any, receipt: _Receipt) -> None:
        try:
            extra = ExtraInfo.split(receipt.properties[PROPERTY_POP_CK])
            until = (extra.pop_time + extra.invisible_time) / 1000.0
        except (ValueError, KeyError, IndexError):
            return
        if until <= time.time():
            return
        with self._lock:
            self._pending.append((getter, receipt, until))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="kombu-rocketmq-ack-retry", daemon=True)
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.INTERVAL)
            with self._lock:
                batch, self._pending = self._pending, []
            if not batch:
                with self._lock:
                    if not self._pending:
                        self._thread = None
                        return
                continue
            keep = []
            for getter, receipt, until in batch:
                if time.time() >= until:
                    log.warning("kombu: gave up acking %s/%s: its lease is over, the broker delivers it again",
                                receipt.topic, receipt.properties[PROPERTY_POP_CK])
                    continue
                try:
                    getter().ack(receipt)
                    log.info("kombu: the ack of %s/%s that failed on a lost connection landed",
                             receipt.topic, receipt.properties[PROPERTY_POP_CK])
                except Exception:
                    keep.append((getter, receipt, until))
            with self._lock:
                self._pending[:0] = keep


class _AckBatcher:
    """The acks of one kombu connection, sent by a background thread as BATCH_ACK_MESSAGE requests, so that
    `basic_ack` does not wait for a round trip (a worker used to spend about half its time there).

    Batching adapts to the rate and delays nothing on purpose: an ack is sent at once when no batch is in
    flight; acks that come while one is in flight go together, as soon as its answer is in (at most
    `MAX_BATCH` per request). So an ack waits at most for the batch before it (one round trip; the client's
    timeout if the broker stalls), and `flush` waits for all of them (at close and at exit). A batch that
    fails on a lost connection marks the connection lost (the next `drain_events` raises, the consumer
    reconnects) and each of its acks goes to `_AckRetry`: sent again until it lands or its lease ends. A
    batch the broker refuses is acked one by one, so that one bad handle does not hold the others back."""

    MAX_BATCH = 64
    IDLE_EXIT = 5.0  # the thread exits after this long without acks (and starts again with the next one)

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._queue: list[_Receipt] = []
        self._busy = False  # a batch is in flight
        self._thread: threading.Thread | None = None
        self._pid = os.getpid()

    def add(self, receipt: _Receipt) -> None:
        if self._pid != os.getpid():  # a forked child: the parent's thread and lock are not ours
            self._reset()
        with self._cond:
            self._queue.append(receipt)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kombu-rocketmq-acks", daemon=True)
                self._thread.start()
            elif not self._busy:
                self._cond.notify()

    def pending(self) -> int:
        """Acks taken but not answered yet (queued or in flight)."""
        with self._cond:
            return len(self._queue) + (1 if self._busy else 0)

    def flush(self, timeout: float) -> bool:
        """Wait until every ack taken so far was answered (or handed to `_AckRetry`); False on timeout."""
        if self._pid != os.getpid():
            return True
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout)

    def _run(self) -> None:
        cond = self._cond
        while True:
            with cond:
                if not self._queue:
                    cond.wait(self.IDLE_EXIT)
                    if not self._queue:
                        self._thread = None
                        return
                batch, self._queue = self._queue[:self.MAX_BATCH], self._queue[self.MAX_BATCH:]
                self._busy = True
            try:
                self._send(batch)
            except Exception:  # never let the thread die with acks queued
                log.exception("kombu: a batch of %d acks failed", len(batch))
            finally:
                with cond:
                    self._busy = False
                    cond.notify_all()

    def _send(self, batch: list[_Receipt]) -> None:
        t = self._transport
        if t.lost is not None and t._settle_from is not None:  # its connection is gone: straight to the retries
            for receipt in batch:
                _ack_retry.add(t._late_pop, receipt)
            return
        settle = t.settle
        try:
            settle(lambda pop: pop.ack_batch(batch), acks=batch)
            return
        except (RemotingError, OSError):
            return  # settle marked the connection lost and queued every ack of the batch for retries
        except MQBrokerError as e:
            if len(batch) == 1:
                log.error("kombu: the broker refused the ack of %s/%s: %s", batch[0].topic,
                          batch[0].properties[PROPERTY_POP_CK], e)
                return
            log.warning("kombu: the broker refused a batch of %d acks (%s); acking them one by one", len(batch), e)
        for receipt in batch:
            try:
                settle(lambda pop, r=receipt: pop.ack(r), acks=[receipt])
            except (RemotingError, OSError):
                pass  # queued for retries by settle
            except MQBrokerError as e:
                log.error("kombu: the broker refused the ack of %s/%s: %s", receipt.topic,
                          receipt.properties[PROPERTY_POP_CK], e)


_ack_batchers: weakref.WeakSet[_AckBatcher] = weakref.WeakSet()


def _flush_ack_batchers(timeout: float = 10.0) -> None:
    """At exit: send what the connections still hold (they may never have been closed)."""
    end = time.monotonic() + timeout
    for b in list(_ack_batchers):
        b.flush(max(end - time.monotonic(), 0.0))


_last_sweep: dict[str, float] = {}  # group -> when a connection of this process last swept its queues
_last_sweep_lock = threading.Lock()


def _sweep_turn(group: str, interval: float) -> bool:
    """Whether a connection of this process should sweep `group`'s expired queues now: at most once per
    `interval` per process (a Celery client's pool holds several connections; one sweep is enough)."""
    now = time.monotonic()
    with _last_sweep_lock:
        if now - _last_sweep.get(group, -1e9) < interval * 0.9:
            return False
        _last_sweep[group] = now
        return True


_ack_retry = _AckRetry()
_consuming: weakref.WeakSet[Transport] = weakref.WeakSet()  # connections of this process that consume
_celery_hooked = False


def _hook_celery_shutdown() -> None:
    """Once per process, when Celery is loaded: on its worker's `worker_shutting_down` signal, give back the
    eta tasks the worker holds (`Transport.give_back_waiting`)."""
    global _celery_hooked
    if _celery_hooked or "celery" not in sys.modules:
        return
    from celery.signals import worker_shutting_down

    worker_shutting_down.connect(_on_worker_shutting_down, weak=False)
    _celery_hooked = True


def _celery_scheduled_ids() -> set[str] | None:
    """Ids of the tasks Celery's worker in this process holds for their eta, not handed to its pool yet
    (`celery.worker.state.scheduled_requests`); None for a Celery without that record."""
    state = sys.modules.get("celery.worker.state")
    scheduled = getattr(state, "scheduled_requests", None)
    if scheduled is None:
        return None
    for _ in range(3):
        try:
            return {r.id for r in list(scheduled)}
        except RuntimeError:  # changed meanwhile
            continue
    return None


def _on_worker_shutting_down(**kwargs: Any) -> None:
    for t in list(_consuming):
        t.give_back_waiting()
atexit.register(_shutdown_settlers)
atexit.register(_flush_ack_batchers)  # runs first (atexit is last in, first out)
os.register_at_fork(after_in_child=_settlers.clear)  # a forked child must not share its parent's sockets
os.register_at_fork(after_in_child=lambda: _ack_retry.__init__())


class _Clients:
    """The RocketMQ clients of one kombu connection, and the shared exchange/binding state."""

    def __init__(self, namesrv: str, namespace: str, group: str, access_key: str | None, secret_key: str | None,
                 retry_max_times: int) -> None:
        self.namespace = namespace
        self.group = group
        keys = {"access_key": access_key, "secret_key": secret_key}
        self.admin = Admin(namesrv, **keys)
        try:
            if not self.admin.broker_addresses():
                raise RemotingError(f"the name server at {namesrv} knows no broker")
            self.producer = Producer(namesrv, group=f"{group}_producer", **keys).start()
            self.pop = PopConsumer(namesrv, group, **keys).start()
            self.reader = PullConsumer(namesrv, f"{group}_bindings", **keys).start()
        except BaseException:
            self.admin.shutdown()
            raise
        self.bindings_topic = system_topic("bindings", namespace)
        self.snapshot_topic = system_topic("bindings_snapshot", namespace)
        self._topics: dict[str, int] = {}  # topics known to exist -> lanes
        self._queue_topics: dict[str, str] = {}  # queue -> topic_name(queue, namespace), a cache
        self._topics_lock = threading.Lock()
        self.ensure_topic(self.bindings_topic, 1)
        self.ensure_topic(self.snapshot_topic, 1)
        try:
            self.admin.create_subscription_group(group, retry_max_times=retry_max_times)
        except MQBrokerError as e:  # no admin rights (ACL) or a broker that refuses: keep its default
            log.warning("kombu: could not set up consumer group %s (%s); its retryMaxTimes stays the broker's", group, e)
        self.shared = SharedState(self._send_record, self._pull_records, self._send_snapshot, self._last_snapshot)

    def shutdown(self) -> None:
        for c in (self.pop, self.producer, self.reader, self.admin):
            try:
                c.shutdown()
            except Exception:  # pragma: no cover - best effort
                log.debug("kombu: client shutdown failed", exc_info=True)

    def queue_topic(self, queue: str) -> str:
        """`names.topic_name(queue, namespace)`, remembered per queue name (a publish needs it every time; a
        name that is not a str, or that topic_name refuses, is not remembered and raises as topic_name does)."""
        if queue.__class__ is not str:
            return topic_name(queue, self.namespace)
        topic = self._queue_topics.get(queue)
        if topic is None:
            topic = topic_name(queue, self.namespace)
            if len(self._queue_topics) >= _QUEUE_TOPICS_MAX:
                self._queue_topics = {}
            self._queue_topics[queue] = topic
        return topic

    def ensure_topic(self, topic: str, lanes: int) -> None:
        if self._topics.get(topic, 0) >= lanes:
            return
        with self._topics_lock:
            if self._topics.get(topic, 0) >= lanes:
                return
            try:
                self.admin.create_topic(topic, queue_nums=lanes)
            except MQBrokerError as e:
                if e.code != ResponseCode.NO_PERMISSION:
                    raise
                lanes = self._existing_lanes(topic, lanes, e)
            if len(self._topics) >= 4096:  # a cache only (creating again is harmless): bounded, many reply queues
                keep = {t: n for t, n in self._topics.items() if t in (self.bindings_topic, self.snapshot_topic)}
                self._topics = keep
            self._topics[topic] = lanes
        self.producer.refresh_route(topic)

    def _existing_lanes(self, topic: str, lanes: int, refused: MQBrokerError) -> int:
        """The queues of `topic` when this account may not create topics (an ACL account without admin rights):
        the topic an operator made for it is used as it is; one that does not exist is an error saying how to
        make it. Fewer queues than a priority queue's lanes: the higher priorities share the first queue."""
        try:
            have = len(self.admin.topic_route(topic).queues)
        except (MQBrokerError, RemotingError, LookupError):
            have = 0
        if have < 1:
            raise MQBrokerError(refused.code, (
                f"topic {topic} does not exist and this account may not create it ({refused.remark}); create it "
                f"with an admin account: rmq-eventstore topic-create {topic} --queues {lanes} --namesrv HOST:PORT "
                "--access-key ... --secret-key ..."), refused.address) from None
        if have < lanes:
            log.warning("kombu: topic %s has %d queues, fewer than the %d lanes of a priority queue, and this account "
                        "may not add queues: priorities above %d share queue 0", topic, have, lanes, have - 1)
        return have

    def delete_topic(self, topic: str) -> bool:
        """Delete a queue's topic (and, in the broker, its pop retry topic): DELETE_TOPIC_IN_BROKER. Without
        admin rights (ACL) the topic stays, with a warning."""
        with self._topics_lock:
            self._topics.pop(topic, None)
        try:
            self.admin.delete_topic(topic)
        except MQBrokerError as e:
            log.warning("kombu: could not delete topic %s (%s); it stays on the broker", topic, e)
            return False
        finally:
            for c in (self.producer, self.pop):
                c._base.forget_route(topic)
        return True

    def forget_topic(self, topic: str) -> None:
        with self._topics_lock:
            self._topics.pop(topic, None)

    def _send_snapshot(self, body: bytes) -> None:
        self.producer.send(Message(self.snapshot_topic, body), queue_id=0)

    def _last_snapshot(self) -> bytes | None:
        top = self.admin.max_offset(self.snapshot_topic, 0)
        if top <= 0:
            return None
        r = self.reader.pull(self.snapshot_topic, 0, top - 1, max_nums=1, suspend_timeout_ms=0)
        if r.status != FOUND or not r.messages:
            return None
        return bytes(r.messages[-1].body)

    def _send_record(self, body: bytes) -> int:
        return self.producer.send(Message(self.bindings_topic, body), queue_id=0).queue_offset

    def _pull_records(self, offset: int, wait_ms: int) -> tuple[int, list[bytes]]:
        r = self.reader.pull(self.bindings_topic, 0, offset, max_nums=256, suspend_timeout_ms=wait_ms)
        if r.status == OFFSET_ILLEGAL:
            log.error("kombu: binding records before offset %d of %s are gone (retention?); bindings made "
                      "before then are lost", r.next_begin_offset, self.bindings_topic)
            return max(r.next_begin_offset, r.min_offset), []
        if r.status != FOUND:
            return offset, []
        return r.next_begin_offset, [bytes(m.body) for m in r.messages]


class QoS(virtual.QoS):
    """kombu's prefetch accounting, counting the messages asked for by POPs under way as held."""

    def __init__(self, channel: Channel, prefetch_count: int = 0) -> None:
        super().__init__(channel, prefetch_count)
        self.reserved = 0  # changed by the draining thread only

    def can_consume(self) -> bool:
        p = self.prefetch_count
        return not p or len(self._delivered) - len(self._dirty) + self.reserved < p

    def can_consume_max_estimate(self) -> int | None:
        p = self.prefetch_count
        if p:
            return max(p - (len(self._delivered) - len(self._dirty)) - self.reserved, 0)
        return None

    def credit(self, batch: int) -> int:
        """How many messages the channel may ask for now (`batch` when the prefetch is unlimited)."""
        est = self.can_consume_max_estimate()
        return batch if est is None else min(est, batch)


class Channel(virtual.Channel):
    """A kombu channel over POP / ACK (see the module docstring)."""

    QoS = QoS
    supports_fanout = True
    do_restore = True
    visibility_timeout = DEFAULT_VISIBILITY_TIMEOUT
    batch_size = DEFAULT_BATCH
    requeue_wait = DEFAULT_REQUEUE_WAIT
    publish_wait = DEFAULT_PUBLISH_WAIT
    from_transport_options = (*virtual.Channel.from_transport_options, "visibility_timeout", "batch_size",
                              "requeue_wait", "publish_wait")

    def __init__(self, connection: Transport, **kwargs: Any) -> None:
        super().__init__(connection, **kwargs)
        self._no_ack: set[str] = set()
        self._auto_delete: set[str] = set()  # auto_delete queues declared on this channel
        self._transport = connection  # kept after close (kombu then sets `connection` to None): late acks

    # -- plumbing ----------------------------------------------------------------------------------------------
    @property
    def clients(self) -> _Clients:
        return self.connection.clients()

    def _topic(self, queue: str) -> str:
        return self.clients.queue_topic(queue)

    def _invisible_ms(self) -> int:
        return max(int(float(self.visibility_timeout) * 1000), 1000)

    def _queue_args(self, queue: str, refresh: bool = False) -> dict[str, Any]:
        return self.clients.shared.queue(queue, refresh=refresh) or {}

    def _lanes(self, queue: str) -> int:
        return LANES if self._queue_args(queue).get("x-max-priority") else 1

    # -- declarations and bindings (shared through the broker) ---------------------------------------------------
    def exchange_declare(self, exchange: str | None = None, type: str = "direct", durable: bool = False,
                         auto_delete: bool = False, arguments: dict | None = None, nowait: bool = False,
                         passive: bool = False) -> None:
        type = type or "direct"
        exchange = exchange or f"amq.{type}"
        if passive:
            if exchange not in self.state.exchanges and self.clients.shared.exchange(exchange) is None:
                raise ChannelError(f"NOT_FOUND - no exchange {exchange!r}", (50, 10), "Channel.exchange_declare",
                                   "404")
            return
        super().exchange_declare(exchange, type, durable, auto_delete, arguments, nowait, passive)
        self.clients.shared.declare_exchange(exchange, type, bool(durable), bool(auto_delete), arguments)

    def exchange_delete(self, exchange: str, if_unused: bool = False, nowait: bool = False) -> None:
        self.clients.shared.delete_exchange(exchange)
        self.state.exchanges.pop(exchange, None)

    def typeof(self, exchange: str, default: str = "direct") -> Any:
        try:
            type = self.state.exchanges[exchange]["type"]
        except KeyError:
            shared = self.clients.shared.exchange(exchange) if exchange else None
            type = shared["type"] if shared else default
        return self.exchange_types[type]

    def queue_bind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                   arguments: dict | None = None, **kwargs: Any) -> None:
        exchange = exchange or "amq.direct"
        meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        if not self.state.has_binding(queue, exchange, routing_key):
            self.state.binding_declare(queue, exchange, routing_key, arguments)
        self.clients.shared.bind(exchange, *meta)

    def queue_unbind(self, queue: str, exchange: str | None = None, routing_key: str = "",
                     arguments: dict | None = None, **kwargs: Any) -> None:
        exchange = exchange or "amq.direct"
        self.state.binding_delete(queue, exchange, routing_key)
        meta = self.typeof(exchange).prepare_bind(queue, exchange, routing_key, arguments)
        self.clients.shared.unbind(exchange, *meta)

    def get_table(self, exchange: str) -> list[tuple[str, str | None, str]]:
        return self.clients.shared.table(exchange)

    def _new_queue(self, queue: str, **kwargs: Any) -> None:
        arguments = kwargs.get("arguments") or {}
        args = {k: arguments[k] for k in ("x-max-priority", "x-message-ttl", "x-expires") if arguments.get(k)}
        self.clients.ensure_topic(self._topic(queue), LANES if args.get("x-max-priority") else 1)
        self.clients.shared.declare_queue(queue, args)
        if kwargs.get("auto_delete"):
            self._auto_delete.add(queue)

    def prepare_queue_arguments(self, arguments: dict[str, Any] | None, **kwargs: Any) -> dict[str, Any]:
        """`Queue(max_priority=, message_ttl=, expires=)` as RabbitMQ's `x-` arguments, which `_new_queue`
        keeps in the shared declaration."""
        return to_rabbitmq_queue_arguments(arguments or {}, **kwargs)

    def _has_queue(self, queue: str, **kwargs: Any) -> bool:
        return self.clients.shared.queue(queue) is not None

    def queue_delete(self, queue: str, if_unused: bool = False, if_empty: bool = False, **kwargs: Any) -> int | None:
        """Delete the queue: its declaration and bindings (shared), then its topic with its lanes and pop
        retry topic (DELETE_TOPIC_IN_BROKER). Returns how many messages it held (counted, not popped)."""
        if if_empty and self._size(queue):
            return None
        c = self.clients
        topic = self._topic(queue)
        self._auto_delete.discard(queue)
        self.state.queue_bindings_delete(queue)
        if c.shared.queue(queue) is None and topic not in c._topics:
            return 0  # not declared (or deleted already, e.g. by Celery's reply collector after auto-delete)
        n = self._size(queue)
        c.shared.delete_queue(queue)
        if not c.delete_topic(topic):  # no admin rights: the topic stays, emptied (a queue declared again is new)
            n = max(n, self._purge_topic(topic))
        return n

    # -- publishing ------------------------------------------------------------------------------------------------
    def _put(self, queue: str, message: dict[str, Any], **kwargs: Any) -> None:
        """Send kombu's message dict to `queue`'s topic: its JSON as the body, the expiry and due time as
        properties, on the lane of its priority (a priority queue) or queue 0."""
        t = self.connection
        c = t._clients  # `self.clients` (t.clients()) without its two calls once the clients exist
        if c is None:
            c = t.clients()
        topic = c._queue_topics.get(queue) if queue.__class__ is str else None  # c.queue_topic's remembered
        if topic is None:
            topic = c.queue_topic(queue)
        shared = c.shared
        args = shared.queue(queue, refresh=False)
        if args is None:  # not declared as far as this process knows: catch up with the log first
            args = shared.queue(queue, refresh=True)
        lanes = LANES if args and args.get("x-max-priority") else 1
        if c._topics.get(topic, 0) < 1:  # ensure_topic's own first test, without the call
            c.ensure_topic(topic, 1)
        props: dict[str, str] = {}
        mprops = message.get("properties") or {}
        expiration = mprops.get("expiration")
        if expiration not in (None, ""):
            try:
                props[PROPERTY_EXPIRE_AT] = str(int(time.time() * 1000) + int(float(expiration)))
            except ValueError:
                pass
        headers = message.get("headers")
        if (mprops.get("deliver_at") in (None, "") and headers.__class__ is dict and "task" in headers
                and not headers.get("eta")):
            due_at = None  # `_due_at`'s answer for a Celery task (protocol 2) without an eta, without the calls
        else:
            due_at = self._due_at(message)
        if due_at is not None:
            props[PROPERTY_DUE_AT] = str(int(due_at * 1000))
        body = _message_json_bytes(message) if _message_json_bytes is not None else None
        if body is None:
            body = _MESSAGE_JSON(message).encode()
        lane = _clamp_priority(message) if lanes > 1 else 0
        if due_at is None:  # `_send`'s case of a message due now, inline (the same steps)
            msg = Message(topic, body, properties=props or None)
            producer = c.producer
            try:
                producer.send(msg, queue_id=lane)
            except ValueError:  # the route we hold predates the lanes: ask again
                producer.refresh_route(topic)
                producer.send(msg, queue_id=lane if lane < len(c.admin.topic_route(topic).queues) else 0)
        elif self._send(topic, body, props, lane, due_at):
            return
        self.connection.expect(queue, float(self.publish_wait))

    def _due_at(self, message: dict[str, Any]) -> float | None:
        """When a message is due at the consumer (epoch s): its `deliver_at` property, or with `eta_timers`
        its Celery eta less `eta_lead`; None for a message due now."""
        deliver_at = (message.get("properties") or {}).get("deliver_at")
        if deliver_at not in (None, ""):
            return float(deliver_at)
        t = self._transport
        if not t.eta_timers:
            return None
        eta = celery_eta(message)
        return None if eta is None else eta - t.eta_lead

    def _send(self, topic: str, body: bytes, props: dict[str, str], lane: int, due_at: float | None,
              keys: str | None = None) -> bool:
        """Send to `topic`'s queue `lane`; as a timer message when `due_at` is more than a tick away (no
        farther than the broker's maximum: a farther one is a hop of a chain, see `_forward_hops`). Whether it
        was sent as a timer message. A broker that refuses the delay with its `timerMaxDelaySec` (a lower
        maximum than `eta_max_delay`) is taken at its word and asked again."""
        t = self._transport
        c = t.clients()
        for _ in range(2):
            due = t.timer_due(due_at)
            msg = Message(topic, body, keys=keys, properties=props or None)
            try:
                try:
                    c.producer.send(msg, queue_id=lane, deliver_at=due)
                except ValueError:  # the route we hold predates the lanes: ask again
                    c.producer.refresh_route(topic)
                    c.producer.send(msg, queue_id=lane if lane < len(c.admin.topic_route(topic).queues) else 0,
                                    deliver_at=due)
                return due is not None
            except MQBrokerError as e:
                m = _MAX_DELAY_RE.search(str(e))
                if due is None or m is None or float(m.group(1)) >= t.eta_max_delay:
                    raise
                log.warning("kombu: the broker's timerMaxDelaySec is %s s: timers farther are chained", m.group(1))
                t.eta_max_delay = float(m.group(1))
        raise AssertionError("unreachable")  # pragma: no cover

    def _put_fanout(self, exchange: str, message: dict[str, Any], routing_key: str, **kwargs: Any) -> None:
        for queue in sorted({q for _, _, q in self.get_table(exchange)}):
            self._put(queue, message, **kwargs)

    # -- consuming ---------------------------------------------------------------------------------------------------
    def basic_consume(self, queue: str, no_ack: bool, *args: Any, **kwargs: Any) -> Any:
        _consuming.add(self._transport)
        _hook_celery_shutdown()
        if no_ack:
            self._no_ack.add(queue)
        else:
            self._no_ack.discard(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def basic_cancel(self, consumer_tag: str) -> Any:
        """Cancel a consumer; an `auto_delete` queue this channel declared is deleted when its last consumer
        on this connection goes (consumers in other processes are not counted: Celery's auto-delete queues,
        reply and event queues, are exclusive to their consumer)."""
        queue = self._tag_to_queue.get(consumer_tag)
        r = super().basic_cancel(consumer_tag)
        if queue is not None and queue not in self._active_queues:
            self._no_ack.discard(queue)
            self._transport.forget_queue(self, queue)
            if (queue in self._auto_delete and self._transport.lost is None
                    and not self._transport.consumes(queue)):
                try:
                    self.queue_delete(queue)
                except self.connection.connection_errors as e:  # it expires (x-expires) or stays
                    log.warning("kombu: could not delete auto-delete queue %s: %r", queue, e)
        return r

    def fetch(self, queue: str, n: int, poll_ms: int = 0) -> list[dict[str, Any]]:
        """Pop up to `n` messages of `queue`, highest lane first; with `poll_ms` the broker waits that long
        for one. Returns kombu's raw messages (delivery tag = receipt), expired ones acked and left out."""
        while n > 0:
            try:
                popped, raws = self._fetch_once(queue, n, poll_ms)
            except MQBrokerError as e:
                if e.code != ResponseCode.TOPIC_NOT_EXIST:
                    raise
                # deleted under us (queue_delete elsewhere, or an expiry sweep that raced a re-declare):
                # the consumer keeps going on a new topic, as the queue is still declared here
                c = self.clients
                c.forget_topic(self._topic(queue))
                c.ensure_topic(self._topic(queue), self._lanes(queue))
                return []
            if raws or not popped:  # popped and all expired: look again
                return raws
        return []

    def _fetch_once(self, queue: str, n: int, poll_ms: int) -> tuple[list[Any], list[dict[str, Any]]]:
        c = self.clients
        topic = self._topic(queue)
        inv = self._invisible_ms()
        lanes = self._lanes(queue)
        if lanes == 1:
            popped = c.pop.pop(topic, max_nums=n, invisible_time=inv, poll_time=poll_ms)
        else:
            popped = []
            for lane in range(lanes - 1, -1, -1):
                popped += c.pop.pop(topic, max_nums=n - len(popped), invisible_time=inv, queue_id=lane)
                if len(popped) >= n:
                    break
            if not popped and poll_ms > 0:
                popped = c.pop.pop(topic, max_nums=n, invisible_time=inv, poll_time=poll_ms)
        return popped, self._to_raw(queue, topic, popped)

    def _to_raw(self, queue: str, topic: str, popped: Iterable[Any]) -> list[dict[str, Any]]:
        out: list[tuple[int, int, dict[str, Any]]] = []
        expired = []
        now = int(time.time() * 1000)
        ttl = self._queue_args(queue).get("x-message-ttl")
        hops: list[tuple[Any, int, _Receipt]] = []
        lanes = self._lanes(queue)
        for i, m in enumerate(popped):
            receipt = _Receipt(topic, m.properties[PROPERTY_POP_CK])
            expire_at = m.properties.get(PROPERTY_EXPIRE_AT)
            if (expire_at and int(expire_at) <= now) or (ttl and m.born_timestamp + int(ttl) <= now):
                expired.append(receipt)
                continue
            try:
                raw = json.loads(bytes(m.body))
                props = raw["properties"]
            except (ValueError, KeyError, TypeError):
                log.error("kombu: %s offset %d is not a kombu message; dropped", topic, m.queue_offset)
                expired.append(receipt)
                continue
            if m.properties.get(PROPERTY_DUE_AT) and self._is_hop(m, now):
                hops.append((m, _clamp_priority(raw) if lanes > 1 else 0, receipt))
                continue
            props["delivery_tag"] = f"{topic}/{receipt.properties[PROPERTY_POP_CK]}"
            if m.reconsume_times > 0:
                raw["redelivered"] = True
                props.setdefault("delivery_info", {})["redelivered"] = True
            out.append((-_clamp_priority(raw), i, raw))
        if expired:
            self.clients.pop.ack_batch(expired)
        if hops:
            self._transport.forward(lambda: self._forward_hops(topic, hops))
        if lanes > 1:
            out.sort(key=lambda t: (t[0], t[1]))
        return [raw for _, _, raw in out]

    def _is_hop(self, m: Any, now_ms: int) -> bool:
        """Whether a popped message is a hop of a chained timer message to send on (`KOMBU_DUE_AT` still more
        than a tick away) rather than deliver: not when it came far earlier than its timer said (a broker that
        does not hold timers: forwarding would spin)."""
        try:
            due_at = int(m.properties[PROPERTY_DUE_AT])
            timer = int(m.properties.get(PROPERTY_TIMER_DELIVER_MS) or 0)
        except ValueError:
            return False
        if due_at - now_ms <= 1000 * TIMER_TICK:
            return False
        if now_ms < timer - 2000 * TIMER_TICK:
            log.warning("kombu: a timer message came %.1f s before its time: the broker does not hold timers; "
                        "delivered now", (timer - now_ms) / 1000.0)
            return False
        return True

    def _forward_hops(self, topic: str, hops: list[tuple[Any, int, _Receipt]]) -> None:
        """Send the next hop of each popped hop (`_is_hop`), then ack the hops sent: sent first, so a worker
        that dies between the two leaves a duplicate hop, never a lost message. Runs on the transport's
        forwarding threads (`Transport.forward`), so the POP that brought them delivers its due messages at
        once. A hop that could not be sent on comes back in `HOP_RETRY` s (its invisible time changed)."""
        t = self._transport
        sent, failed = [], []
        hops = sorted(hops, key=lambda h: int(h[0].properties[PROPERTY_DUE_AT]))  # the nearest first
        for m, lane, receipt in hops:
            props = {k: m.properties[k] for k in (PROPERTY_EXPIRE_AT, PROPERTY_DUE_AT) if m.properties.get(k)}
            key = _hop_key(m)
            try:
                if m.reconsume_times > 0 and key is not None and self._hop_sent(topic, key):
                    log.info("kombu: the next hop of timer message %s was sent before; not sent again", key)
                else:
                    self._send(topic, bytes(m.body), props, lane, int(m.properties[PROPERTY_DUE_AT]) / 1000.0,
                               keys=key)
                sent.append(receipt)
            except Exception:
                log.warning("kombu: could not send the next hop of a timer message; it comes back in %s s",
                            HOP_RETRY, exc_info=True)
                failed.append(receipt)
        try:
            if sent:
                t.settle(lambda pop: pop.ack_batch(sent))
            for r in failed:
                t.settle(lambda pop, r=r: pop.change_invisible_time(r, int(HOP_RETRY * 1000)))
        except Exception:
            log.warning("kombu: could not settle forwarded hops; they come back after the visibility timeout "
                        "(then a task may run twice)", exc_info=True)

    def _hop_sent(self, topic: str, key: str) -> bool:
        """Whether the broker holds a next hop keyed `key` (`_hop_key`): a timer message waiting in the timer
        topic, or one it delivered to `topic`. Asked only of a hop that came back (a send that timed out and
        may have been stored, or a worker gone between the send and the ack), so it is not sent on twice."""
        admin = self._transport.clients().admin
        for t in (RMQ_SYS_WHEEL_TIMER_TOPIC, topic):
            try:
                found = admin.query_message(t, key, 4, brokers_of=topic)
            except MQBrokerError as e:  # refused (an ACL without SUB on the topic): not known, so sent again
                log.warning("kombu: could not look up hop %s in %s (%s); it is sent on again", key, t, e)
                return False
            if any(m.properties.get("KEYS") == key for m in found):
                return True
        return False

    def settle_no_ack(self, queue: str, raws: list[dict[str, Any]]) -> None:
        """Ack at once what a no-ack consumer of `queue` gets."""
        if raws and queue in self._no_ack:
            self.clients.pop.ack_batch([_receipt(r["properties"]["delivery_tag"]) for r in raws])

    def _get(self, queue: str, timeout: float | None = None) -> dict[str, Any]:
        raws = self.fetch(queue, 1)
        wait = self.connection.expected(queue)
        if not raws and wait > 0:  # a message this connection sent or gave back is on its way
            raws = self.fetch(queue, 1, poll_ms=max(int(wait * 1000), 1))
        if not raws:
            raise Empty()
        return raws[0]

    def basic_get(self, queue: str, no_ack: bool = False, **kwargs: Any) -> Any:
        try:
            raw = self._get(queue)
        except Empty:
            return None
        message = self.Message(raw, channel=self)
        if no_ack:
            self.clients.pop.ack(_receipt(message.delivery_tag))
        else:
            self.qos.append(message, message.delivery_tag)
        return message

    def _size(self, queue: str) -> int:
        c = self.clients
        topic = self._topic(queue)
        if c.shared.queue(queue) is None and topic not in c._topics:
            return 0
        n = 0
        try:
            queues = sorted({q for _, q in c.admin.topic_route(topic).read_queues})
            for t, qs in ((topic, queues), (pop_retry_topic(c.group, topic), [0])):
                for q in qs:
                    top = c.admin.max_offset(t, q)
                    if top <= 0:
                        continue
                    done = c.admin.consumer_offset(c.group, t, q)
                    n += top - max(done, c.admin.min_offset(t, q), 0)
        except MQBrokerError:
            return n
        return max(n, 0)

    def _purge(self, queue: str) -> int:
        c = self.clients
        topic = self._topic(queue)
        if c.shared.queue(queue) is None and topic not in c._topics:
            return 0
        return self._purge_topic(topic)

    def _purge_topic(self, topic: str) -> int:
        c = self.clients
        n = 0
        while True:
            popped = c.pop.pop(topic, max_nums=32, invisible_time=60_000)
            if not popped:
                return n
            c.pop.ack_batch(popped)
            n += len(popped)

    # -- acks ------------------------------------------------------------------------------------------------------
    def basic_ack(self, delivery_tag: str, multiple: bool = False) -> None:
        try:
            self._transport.ack(_receipt(delivery_tag))
        finally:
            super().basic_ack(delivery_tag)
            self.connection.credit_freed(self)

    def basic_reject(self, delivery_tag: str, requeue: bool = False) -> None:
        try:
            if requeue:
                self._give_back(delivery_tag)
            else:
                self._transport.ack(_receipt(delivery_tag))
        finally:
            self.qos.ack(delivery_tag)  # forget it either way: the broker has it now
            self.connection.credit_freed(self)

    def _give_back(self, delivery_tag: str) -> None:
        receipt = _receipt(delivery_tag)
        self._transport.settle(lambda pop: pop.change_invisible_time(receipt, 0))
        try:
            queue = queue_name(receipt.topic, self._transport.namespace)
        except ValueError:
            return
        self._transport.expect(queue, float(self.requeue_wait))

    def _restore(self, message: Any) -> None:
        if self._transport.lost is not None and not self._transport.restore_on_connection_loss():
            # The connection was lost: leave the message to its lease. It may still be running (Celery 5 keeps
            # acks_late tasks running across a reconnect and acks them later through `settle`); giving it
            # back now would run it twice. If nobody settles it, the broker's revive brings it back when its
            # visibility_timeout is over.
            return
        self._give_back(message.delivery_tag)

    def _restore_at_beginning(self, message: Any) -> None:
        self._restore(message)

class Transport(virtual.Transport):
    """kombu transport for rmq_eventstore's broker (or Apache RocketMQ 5): see the module docstring.

    URLs: `rocketmq://host:9876//` (a name server; `rocketmq://AK:SK@host:9876//` signs requests with ACL
    keys) or `rocketmq:///path/to/store` (the broker owning that local store, found or started).
    Transport options: `visibility_timeout` (s, 3600), `namespace` (''), `group` ('kombu'),
    `batch_size` (32), `max_poll` (s, 1.0: the longest POP long poll on kombu's hub, or while several queues
    wait in `drain_events`), `requeue_wait` (s, 2.0), `retry_max_times` (10000),
    `broker_options` (settings for a local broker this process starts), `restore_on_connection_loss` (unset:
    follow Celery's `worker_cancel_long_running_tasks_on_connection_loss`, see `restore_on_connection_loss`),
    `ack_batching` (True: acks leave in batches from a background thread, `_AckBatcher`; False: each
    `basic_ack` waits for its ACK_MESSAGE's answer), `eta_timers` (True: tasks with an eta are sent as timer
    messages; False: sent at once, held by the worker, as with Redis), `eta_lead` (s, 1.5: how long before its
    eta a task reaches the worker), `eta_max_delay` (s, 259200: the broker's `timerMaxDelaySec`; farther etas
    are chained; a broker that says it holds less is believed)."""

    Channel = Channel
    default_port = DEFAULT_PORT
    driver_type = "rocketmq"
    driver_name = "rmq_eventstore"
    polling_interval = 0.1  # only used when no channel can take a message (its prefetch is used up)
    connection_errors = (*virtual.Transport.connection_errors, RemotingError, LocalBrokerError, OSError,
                         socket.timeout)
    channel_errors = (*virtual.Transport.channel_errors, MQBrokerError, TopicValidationError)
    implements = virtual.Transport.implements.extend(
        asynchronous=True, exchange_type=frozenset(["direct", "topic", "fanout"]), heartbeats=False)

    def __init__(self, client: Any, **kwargs: Any) -> None:
        super().__init__(client, **kwargs)
        opts = client.transport_options or {}
        _warn_unknown_options(opts)
        self.namespace = validate_namespace(opts.get("namespace", ""))
        group = opts.get("group", "kombu")
        self.group = f"{self.namespace}%{group}" if self.namespace else group
        self.max_poll = float(opts.get("max_poll", DEFAULT_MAX_POLL))
        self.retry_max_times = int(opts.get("retry_max_times", DEFAULT_RETRY_MAX_TIMES))
        self.broker_options = opts.get("broker_options")
        self.expiry_sweep_interval = float(opts.get("expiry_sweep_interval", DEFAULT_SWEEP_INTERVAL))
        self._keeper: threading.Thread | None = None
        self._keeper_stop = threading.Event()
        self.eta_timers = _as_bool(opts.get("eta_timers", True))
        self.eta_lead = float(opts.get("eta_lead", DEFAULT_ETA_LEAD))
        self.eta_max_delay = float(opts.get("eta_max_delay", _TIMER_MAX_DELAY))
        if self.eta_lead < 0 or self.eta_max_delay < 2 * TIMER_TICK:
            raise ValueError(f"eta_lead must be >= 0 and eta_max_delay >= {2 * TIMER_TICK} s, not "
                             f"{self.eta_lead} and {self.eta_max_delay}")
        restore = opts.get("restore_on_connection_loss")
        self._restore_on_loss = None if restore is None else bool(restore)
        self._clients: _Clients | None = None
        self._clients_lock = threading.Lock()
        self._inflight: dict[tuple[int, str], tuple[concurrent.futures.Future, Channel, str, int]] = {}
        # what finished POPs brought and is not delivered yet: (id(channel), queue) -> (channel, queue, raws)
        self._held: dict[tuple[int, str], tuple[Channel, str, deque[dict[str, Any]]]] = {}
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._abandoned: list[concurrent.futures.Future] = []  # POPs of cancelled consumers (`forget_queue`)
        self._waiting_thread: threading.Thread | None = None  # gives back held eta tasks (`give_back_waiting`)
        self._retiring = False  # Celery's worker is shutting down: nothing more is popped or delivered
        self._forwarder: concurrent.futures.ThreadPoolExecutor | None = None  # sends hops on (`forward`)
        self._hub: Any = None  # kombu's Hub this connection is registered with (Celery's asynloop)
        self._hub_thread: int | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None  # read end is the hub's reader
        self._wake_pid = 0
        self._rr = count()
        self._expected: dict[str, float] = {}  # queue -> until when a message sent or given back is due
        self._pid = os.getpid()
        self._closed = False
        self.lost: BaseException | None = None  # the connection error that ended this connection, if any
        self._settle_from: tuple[str, str | None] | None = None  # (name server, local store) once connected
        self._keys: tuple[str | None, str | None] = (None, None)
        self._acks: _AckBatcher | None = None
        if opts.get("ack_batching", True):
            self._acks = _AckBatcher(self)
            _ack_batchers.add(self._acks)

    @property
    def default_connection_params(self) -> dict[str, Any]:
        """kombu's defaults without its `localhost`: a `rocketmq:///path` URL has no host on purpose (the
        local store's broker is found by its path), and with a default host kombu warns "No hostname was
        supplied" at every connect. A URL with neither host nor path still means 127.0.0.1 (`_namesrv`)."""
        return {"port": self.default_port}

    def driver_version(self) -> str:
        return __version__

    def timer_due(self, due_at: float | None, now: float | None = None) -> int | None:
        """The timer a message due at `due_at` (epoch s) is sent with (epoch ms): None when it is due within a
        tick (sent as it is), else `due_at`, or the farthest the broker holds (`eta_max_delay` less a tick for
        the clocks) when that is nearer: a hop of a chain."""
        if due_at is None:
            return None
        now = time.time() if now is None else now
        if due_at - now <= TIMER_TICK:
            return None
        return int(min(due_at, now + self.eta_max_delay - TIMER_TICK) * 1000)

    def expect(self, queue: str, seconds: float) -> None:
        """A message is on its way to `queue` (sent, or given back) and readable within `seconds`: a get
        that finds nothing long-polls that long rather than answering "empty" (read your writes; the
        broker makes a sent message readable, and revives a given-back one, asynchronously)."""
        now = time.monotonic()
        until = now + seconds
        if self._expected.get(queue, 0.0) < until:
            if len(self._expected) >= 1024 and queue not in self._expected:  # many short-lived reply queues
                self._expected = {q: t for q, t in self._expected.items() if t > now}
            self._expected[queue] = until

    def expected(self, queue: str) -> float:
        until = self._expected.get(queue)
        if until is None:
            return 0.0
        left = until - time.monotonic()
        if left <= 0:
            self._expected.pop(queue, None)
        return max(left, 0.0)

    # -- connecting --------------------------------------------------------------------------------------------
    def _namesrv(self) -> str:
        """The name server: `host:port` from the URL, or that of the broker owning the local store the URL
        names (`rocketmq:///path`: no host, the path is kombu's virtual host), found or started."""
        c = self.client
        host = c.hostname
        path = (c.virtual_host or "").strip().strip("/")
        if path:  # Celery fills in kombu's default host ('localhost') and port: the path decides
            if host not in (None, "", "localhost", "127.0.0.1"):
                raise ValueError(f"rocketmq://{host}/{path}: a name server URL has no path, and a local store "
                                 "URL has no host (rocketmq:///path/to/store)")
            kw = {"broker_options": self.broker_options} if self.broker_options else {}
            return ensure_local_broker("/" + path, **kw).namesrv_addr
        host = host or "127.0.0.1"
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"{host}:{c.port or DEFAULT_PORT}"

    def clients(self) -> _Clients:
        if self._clients is None:
            with self._clients_lock:
                if self._clients is None:
                    if self._closed:
                        raise RemotingError("this kombu connection is closed")
                    namesrv = self._namesrv()
                    self._keys = (self.client.userid or None, self.client.password or None)
                    self._clients = _Clients(namesrv, self.namespace, self.group, *self._keys, self.retry_max_times)
                    path = (self.client.virtual_host or "").strip().strip("/")
                    self._settle_from = (namesrv, "/" + path if path else None)
                    if self._keeper is None or not self._keeper.is_alive():
                        self._keeper_stop.clear()
                        self._keeper = threading.Thread(target=self._keep, name="kombu-rocketmq-expiry",
                                                        daemon=True)
                        self._keeper.start()
        return self._clients

    # -- queue expiry (x-expires) --------------------------------------------------------------------------
    def consumes(self, queue: str) -> bool:
        """Whether a channel of this connection consumes `queue`."""
        return any(queue in ch._active_queues for ch in list(self.channels) if not ch.closed)

    def _keep(self) -> None:
        """Once a second: lease the `x-expires` queues this connection consumes (every third of their
        expiry), and every `expiry_sweep_interval` seconds sweep: delete the queues unused for longer than
        their `x-expires` (see `sweep`)."""
        leased: dict[str, float] = {}
        last_sweep = time.monotonic()
        while not self._keeper_stop.wait(1.0):
            c = self._clients
            if c is None or self._closed or self.lost is not None or self._pid != os.getpid():
                continue
            try:
                now = time.time()
                for ch in list(self.channels):
                    for q in list(ch._active_queues):
                        ttl = (c.shared.queue(q, refresh=False) or {}).get("x-expires")
                        if ttl and now - leased.get(q, 0.0) >= max(int(ttl) / 3000.0, 0.5):
                            c.shared.lease(q)
                            leased[q] = now
                if self.expiry_sweep_interval > 0 and time.monotonic() - last_sweep >= self.expiry_sweep_interval:
                    last_sweep = time.monotonic()
                    if _sweep_turn(self.group, self.expiry_sweep_interval):  # one connection per process sweeps
                        self.sweep()
            except Exception as e:  # a lost broker: the connection's own calls report it
                log.debug("kombu: lease/sweep round failed: %r", e)

    def sweep(self) -> list[str]:
        """Delete the queues declared with `x-expires` that nobody declared, leased (consumed) or deleted for
        that long: their declaration and bindings (a conditional delete record, void if someone used the
        queue after this process looked), then their topic. Every transport process sweeps; two sweeping
        at once delete the queue once. Returns the queues deleted."""
        c = self.clients()
        gone = []
        for q, last in c.shared.expired(int(time.time() * 1000)):
            if self.consumes(q):
                continue  # ours: its lease is on its way
            if c.shared.delete_queue(q, unused_since=last):
                c.delete_topic(topic_name(q, self.namespace))
                gone.append(q)
                log.info("kombu: queue %s expired (x-expires) and was deleted", q)
        return gone

    def restore_on_connection_loss(self) -> bool:
        """Whether a connection closed after a loss gives its unacked messages back at once (transport option
        `restore_on_connection_loss`). Unset: what the Celery worker of this process does with acks_late
        tasks running at a loss: with `worker_cancel_long_running_tasks_on_connection_loss` (Celery 6's
        default) it cancels them, expecting the broker to redeliver them, so give them back; without it (Celery
        5's default) they keep running and ack later, so leave them to their leases. No Celery: leases."""
        if self._restore_on_loss is not None:
            return self._restore_on_loss
        celery = sys.modules.get("celery")
        if celery is None:
            return False
        try:
            return bool(celery.current_app.conf.worker_cancel_long_running_tasks_on_connection_loss)
        except Exception:  # no app configured, or a Celery without the setting
            return False

    def _late_pop(self) -> PopConsumer:
        """The process-wide settler of this connection's group (`_settler`), at the broker's current address."""
        if self._settle_from is None:
            raise RemotingError("this kombu connection was closed before it was established")
        namesrv, store = self._settle_from
        if store is not None:  # the store's broker may have been replaced (new ports) since
            found = find_local_broker(store)
            namesrv = found.namesrv_addr if found is not None else namesrv
        return _settler(namesrv, self.group, *self._keys)

    def ack(self, receipt: _Receipt) -> None:
        """Settle a delivered message: through the connection's `_AckBatcher` (returns at once; transport
        option `ack_batching`, default on), else with one ACK_MESSAGE round trip. A malformed receipt handle
        raises ValueError here, either way."""
        ExtraInfo.split(receipt.properties[PROPERTY_POP_CK])
        if self._acks is None:
            self.settle(lambda pop: pop.ack(receipt), acks=[receipt])
        else:
            self._acks.add(receipt)

    def flush_acks(self, timeout: float = 10.0) -> bool:
        """Wait until every ack `basic_ack` took so far is answered by the broker (or, its connection lost,
        handed to the background retries); False when `timeout` (s) ran out first."""
        return True if self._acks is None else self._acks.flush(timeout)

    def settle(self, op: Any, ack: _Receipt | None = None, acks: list[_Receipt] | None = None) -> Any:
        """Run `op(pop_consumer)` (an ack, a reject, a give-back) on this connection's POP consumer, or, once
        the connection is closed, on the process-wide settler of the group (`_settler`): an ack that comes
        after Celery replaced the connection still lands. A connection error marks the connection lost, so
        the next `drain_events` raises it and the consumer reconnects at once; acks (`ack`, `acks`: their
        receipts) that failed so are also sent again in the background until they land or their lease is
        over (`_AckRetry`)."""
        if ack is not None:
            acks = [ack, *(acks or [])]
        clients = self._clients
        try:
            if clients is not None and not self._closed:
                return op(clients.pop)
            if self._settle_from is None and not self._closed:
                return op(self.clients().pop)
            return op(self._late_pop())
        except (RemotingError, OSError) as e:
            if not self._closed and self.lost is None:
                self.lost = e
            if acks and self._settle_from is not None:
                for receipt in acks:
                    _ack_retry.add(self._late_pop, receipt)
            raise

    def establish_connection(self) -> Transport:
        self.clients()
        return super().establish_connection()

    def forward(self, job: Any) -> None:
        """Run `job` (sending hops on, `Channel._forward_hops`) on this connection's forwarding threads; close
        waits for them."""
        with self._clients_lock:
            if self._forwarder is None:
                self._forwarder = concurrent.futures.ThreadPoolExecutor(
                    max_workers=FORWARD_THREADS, thread_name_prefix="kombu-rocketmq-hops")
            self._forwarder.submit(job)

    def give_back_waiting(self) -> None:
        """Celery's worker in this process began its shutdown (signal `worker_shutting_down`): its hub fires
        no more timers, so the tasks it holds for an eta still ahead will not run here. Give them back now,
        on a thread (this runs in a signal handler), so another worker runs them on time, instead of at
        close, once the pool has stopped (a second or more). Other unacked messages (running tasks) wait
        for close as before. `close_connection` waits for the thread, so nothing is given back twice."""
        if self._closed or self.lost is not None:
            return
        self._retiring = True  # no more POPs, no more deliveries: what comes in goes back
        for key in list(self._inflight):
            ch, queue = self._inflight[key][1], self._inflight[key][2]
            self.forget_queue(ch, queue)
        held = [raw for _, _, h in self._held.values() for raw in h]
        for _, (ch, _, h) in list(self._held.items()):
            ch.qos.reserved -= len(h)
        self._held.clear()
        waiting = [(None, raw["properties"]["delivery_tag"]) for raw in held]
        now = time.time()
        scheduled = _celery_scheduled_ids()
        for ch in list(self.channels):
            for _ in range(3):  # the hub thread may change the dict meanwhile
                try:
                    delivered = list(ch.qos._delivered.items())
                    break
                except RuntimeError:
                    continue
            else:
                continue
            for tag, message in delivered:
                headers = getattr(message, "headers", None) or {}
                if tag in ch.qos._dirty or not headers.get("eta"):
                    continue
                if scheduled is not None:
                    if headers.get("id") in scheduled:
                        waiting.append((ch, tag))
                elif (eta := celery_eta({"headers": headers})) is not None and eta > now + 0.05:
                    waiting.append((ch, tag))
        if not waiting:
            return

        def give_back() -> None:
            for ch, tag in waiting:
                try:
                    receipt = _receipt(tag)
                    self.settle(lambda pop, r=receipt: pop.change_invisible_time(r, 0))
                    if ch is not None:
                        ch.qos.ack(tag)  # given back: not restored again at close
                except Exception:
                    log.debug("kombu: could not give back a waiting eta task at shutdown", exc_info=True)

        self._waiting_thread = threading.Thread(target=give_back, name="kombu-rocketmq-eta-giveback", daemon=True)
        self._waiting_thread.start()

    def forget_queue(self, ch: Channel, queue: str) -> None:
        """`ch` no longer consumes `queue` (a cancel; Celery's warm shutdown cancels first, and its hub may
        not turn again): give back at once what POPs brought for it and nobody took, and what the POP under
        way for it brings (when it ends, on its pool thread), rather than at close or after the lease."""
        key = (id(ch), queue)
        entry = self._inflight.pop(key, None)
        if entry is not None:
            fut, _, _, n = entry
            ch.qos.reserved -= n
            self._abandoned = [f for f in self._abandoned if not f.done()]
            self._abandoned.append(fut)
            fut.add_done_callback(self._give_back_result)
        if key in self._held:
            self._release_held()

    def _give_back_result(self, fut: concurrent.futures.Future) -> None:
        """The end of a POP nobody waits for any more (`forget_queue`): its messages go back at once."""
        try:
            raws = fut.result(timeout=0) if not fut.cancelled() else []
        except BaseException:  # failed: it brought nothing (or the broker gives it back, its client gone)
            return
        for raw in raws or ():
            receipt = _receipt(raw["properties"]["delivery_tag"])
            try:
                self.settle(lambda pop, r=receipt: pop.change_invisible_time(r, 0))
            except Exception:
                log.warning("kombu: could not give back a message popped for a cancelled consumer; it comes "
                            "back after its visibility timeout", exc_info=True)

    def close_connection(self, connection: Any) -> None:
        self._keeper_stop.set()
        try:
            if self._acks is not None and not self._acks.flush(self._ack_flush_timeout()):
                log.warning("kombu: %d acks still unanswered at close; they go on in the background",
                            self._acks.pending())
            self.unregister_from_event_loop(connection, self._hub)
            if self._waiting_thread is not None:
                self._waiting_thread.join(timeout=30)
            try:
                super().close_connection(connection)  # channels first: their unacked messages go back now
            finally:
                try:
                    self._settle_pops(wait=True)  # then what POPs under way bring goes back too
                except self.connection_errors as e:  # the connection is lost already: closing goes on
                    log.debug("kombu: a POP under way failed at close: %r", e)
                abandoned, self._abandoned = self._abandoned, []
                concurrent.futures.wait(abandoned, timeout=self.max_poll + 10)
                if self._forwarder is not None:  # hops being sent on: sent and acked before the clients go
                    self._forwarder.shutdown(wait=True)
                    self._forwarder = None
        finally:
            self._closed = True
            if self._executor is not None:
                self._executor.shutdown(wait=False)
                self._executor = None
            if self._wake is not None:
                for s in self._wake:
                    s.close()
                self._wake = None
            if self._clients is not None:
                self._clients.shutdown()
                self._clients = None

    def _ack_flush_timeout(self) -> float:
        """How long close waits for the acks in flight: one request timeout and a little."""
        clients = self._clients
        return (clients.pop._base.timeout if clients is not None else 3.0) + 2.0

    # -- draining ----------------------------------------------------------------------------------------------
    def _candidates(self) -> list[tuple[Channel, str]]:
        """(channel, queue) pairs being consumed and without a POP under way, rotated for fairness."""
        out: list[tuple[Channel, str]] = []
        if self._retiring:
            return out
        for ch in list(self.channels):
            if ch.closed or not ch._consumers:
                continue
            for q in list(ch._active_queues):
                if (id(ch), q) not in self._inflight and q in self._callbacks:
                    out.append((ch, q))
        if out:
            k = next(self._rr) % len(out)
            out = out[k:] + out[:k]
        return out

    def _deliver_raws(self, ch: Channel, queue: str, raws: list[dict[str, Any]]) -> int:
        if not raws:
            return 0
        ch.settle_no_ack(queue, raws)
        for raw in raws:
            self._deliver(raw, queue)
        return len(raws)

    def _start_pop(self, ch: Channel, queue: str, n: int, poll_ms: int) -> None:
        """A POP of up to `n` messages of `queue` under way on a pool thread (it waits in the remoting client
        for its response), its `n` counted as held by the channel's QoS until it is settled; with a hub, its
        end wakes the hub through the wake-up socket."""
        if self._executor is None:
            self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=16,
                                                                   thread_name_prefix="kombu-rocketmq-pop")
        ch.qos.reserved += n
        try:
            fut = self._executor.submit(ch.fetch, queue, n, poll_ms)
        except BaseException:
            ch.qos.reserved -= n
            raise
        self._inflight[(id(ch), queue)] = (fut, ch, queue, n)
        if self._hub is not None:
            fut.add_done_callback(self._signal)

    def _settle_pops(self, wait: bool = False) -> None:
        """Move what finished POPs brought into the channels' held messages (still counted as held by their
        QoS); raise the first error a POP met (a lost connection) once all are settled. `wait`: wait for
        the POPs under way (at close)."""
        error: BaseException | None = None
        for key, (fut, ch, queue, n) in list(self._inflight.items()):
            if not fut.done():
                if not wait:
                    continue
                concurrent.futures.wait([fut], timeout=self.max_poll + 10)
            del self._inflight[key]
            ch.qos.reserved -= n
            try:
                raws = fut.result(timeout=0)
            except BaseException as e:  # a lost connection: raised after the others are settled
                error = error or e
                continue
            if raws:
                held = self._held.setdefault(key, (ch, queue, deque()))[2]
                held.extend(raws)
                ch.qos.reserved += len(raws)
        if self._held:
            self._release_held(everything=wait)
        if error is not None:
            raise error

    def _release_held(self, everything: bool = False) -> None:
        """Give back (invisible time 0) held messages nobody consumes any more (all of them at close)."""
        for key, (ch, queue, held) in list(self._held.items()):
            if not (everything or ch.closed or queue not in ch._active_queues or queue not in self._callbacks):
                continue
            del self._held[key]
            ch.qos.reserved -= len(held)
            for raw in held:
                if self._clients is None or self.lost is not None:  # lost: they come back when their lease ends
                    break
                try:
                    self._clients.pop.change_invisible_time(_receipt(raw["properties"]["delivery_tag"]), 0)
                except Exception:
                    log.warning("kombu: could not give back a message nobody consumes; it comes back after "
                                "its visibility timeout", exc_info=True)

    def _may_deliver(self, ch: Channel) -> bool:
        """Whether `ch` may take one of its held messages: `qos.can_consume()` (kombu's own test, so a patched
        `can_consume` is honoured too) counting delivered messages and POPs under way, not the held ones
        (already popped: after the prefetch count was lowered they may outnumber the credit, and must not
        block each other)."""
        held = sum(len(h) for c, _, h in self._held.values() if c is ch)
        ch.qos.reserved -= held
        try:
            return bool(ch.qos.can_consume())
        finally:
            ch.qos.reserved += held

    def _deliver_held(self) -> int:
        """Deliver held messages through `_deliver` while each channel's QoS lets it take one."""
        delivered = 0
        if self._retiring:
            return delivered
        for key, (ch, queue, held) in list(self._held.items()):
            while held and not ch.closed and queue in self._callbacks and self._may_deliver(ch):
                raw = held.popleft()
                ch.qos.reserved -= 1
                if not held:
                    self._held.pop(key, None)
                ch.settle_no_ack(queue, [raw])
                self._deliver(raw, queue)
                delivered += 1
        return delivered

    def drain_events(self, connection: Any, timeout: float | None = None) -> None:
        """Deliver what the consumed queues have (see `_drain`). A connection error marks the connection
        lost (its unacked messages are then left to their leases when it closes, see `Channel._restore`);
        an ack that failed on a lost connection is raised here, so the consumer reconnects at once."""
        if self.lost is not None:
            raise self.lost
        try:
            self._drain(connection, timeout)
        except TimeoutError:  # socket.timeout: nothing came in time, the connection is fine
            raise
        except self.connection_errors as e:
            if self.lost is None:
                self.lost = e
            raise

    def _drain(self, connection: Any, timeout: float | None = None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            self._settle_pops()
            if self._deliver_held():
                return
            cands = self._candidates()
            delivered = 0
            for ch, q in cands:  # what is there already, without waiting
                n = ch.qos.credit(ch.batch_size) if ch.qos.can_consume() else 0
                if n > 0:
                    delivered += self._deliver_raws(ch, q, ch.fetch(q, n))
            if delivered:
                return
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise TimeoutError()  # socket.timeout
            waiting = [(ch, q) for ch, q in cands if ch.qos.can_consume() and ch.qos.credit(1) > 0]
            if len(waiting) == 1 and not self._inflight:  # one queue: the long poll waits in this thread
                ch, q = waiting[0]
                wait = 20.0 if remaining is None else remaining
                raws = ch.fetch(q, ch.qos.credit(ch.batch_size), poll_ms=max(int(wait * 1000), 1))
                if self._deliver_raws(ch, q, raws):
                    return
                continue
            wait = self.max_poll if remaining is None else min(remaining, self.max_poll)
            if not waiting and not self._inflight:  # nothing to wait on: no consumer, or no credit
                time.sleep(min(self.polling_interval, wait))
                continue
            for ch, q in waiting:  # several queues: one long poll each, reserving its credit
                if ch.qos.can_consume() and ch.qos.credit(1) > 0:
                    self._start_pop(ch, q, 1, max(int(wait * 1000), 1))
            concurrent.futures.wait([f for f, *_ in self._inflight.values()], timeout=wait,
                                    return_when=concurrent.futures.FIRST_COMPLETED)

    # -- kombu's event loop (Celery's asynloop) ----------------------------------------------------------------
    def _wake_pair(self) -> tuple[socket.socket, socket.socket]:
        """The wake-up socket pair of this process (a forked child makes its own)."""
        if self._wake is None or self._wake_pid != os.getpid():
            r, w = socket.socketpair()
            r.setblocking(False)
            w.setblocking(False)
            self._wake, self._wake_pid = (r, w), os.getpid()
        return self._wake

    def _signal(self, *_: Any) -> None:
        """Make the wake-up socket readable (from any thread: a POP's end, an ack freeing credit)."""
        wake = self._wake
        if wake is not None:
            try:
                wake[1].send(b"\0")
            except OSError:  # full (a wake-up is pending anyway) or closed
                pass

    def credit_freed(self, channel: Channel) -> None:
        """An ack or reject freed `channel`'s credit: from a thread other than the hub's, wake the hub so it
        starts the next POP now (in the hub's thread its next tick does)."""
        if self._hub is not None and threading.get_ident() != self._hub_thread:
            self._signal()

    def register_with_event_loop(self, connection: Any, loop: Any) -> None:
        """Put this connection on kombu's hub (Celery's asynloop): the read end of a wake-up socket pair as a
        reader (`on_readable`), and a tick callback that starts a POP long poll on a pool thread for each
        consumed queue with credit. A POP's end makes the socket readable; no thread sleeps to poll.
        Idempotent: a previous registration (this hub or another) is removed first."""
        if self._hub is not None:
            self.unregister_from_event_loop(connection, self._hub)
        r, _ = self._wake_pair()
        self._hub, self._hub_thread = loop, threading.get_ident()
        loop.add_reader(r.fileno(), self.on_readable, connection, loop)
        loop.on_tick.add(self._on_tick)

    def unregister_from_event_loop(self, connection: Any, loop: Any) -> None:
        """Take this connection off `loop`: its tick callback, and its reader if the fd is still ours (after a
        `hub.reset()` and a reconnect the same fd number may be another connection's)."""
        if loop is None:
            return
        loop.on_tick.discard(self._on_tick)
        if self._wake is not None:
            fd = self._wake[0].fileno()
            entry = loop.readers.get(fd) if fd >= 0 else None
            if entry is not None and entry[0] == self.on_readable:
                loop.remove_reader(fd)
        if loop is self._hub:
            self._hub = None

    def _on_tick(self) -> None:
        """Every hub iteration: start POPs where there is credit and none is under way; wake the hub if held
        messages may be delivered now (credit came back). Without credit nothing is asked for and the
        socket stays quiet: the consumer is paused."""
        if self._held:
            self._release_held()
            if any(not ch.closed and self._may_deliver(ch) for ch, _, _ in list(self._held.values())):
                self._signal()
        self._issue_pops()

    def _issue_pops(self) -> None:
        poll_ms = max(int(self.max_poll * 1000), 1)
        for ch, q in self._candidates():
            if ch.qos.can_consume():
                n = ch.qos.credit(ch.batch_size)
                if n > 0:
                    self._start_pop(ch, q, n, poll_ms)

    def on_readable(self, connection: Any, loop: Any) -> None:
        """The wake-up socket is readable: settle the POPs that ended, start the next POPs (with the credit
        left), and deliver held messages through `_deliver` while `qos.can_consume()`. A POP's error (a lost
        connection, in `connection_errors`) is raised here, so Celery reconnects."""
        if self.lost is not None:
            raise self.lost
        wake = self._wake
        if wake is not None:
            try:
                while wake[0].recv(4096):
                    pass
            except OSError:  # drained (EAGAIN), or closed
                pass
        try:
            self._settle_pops()
        except self.connection_errors as e:
            if self.lost is None:
                self.lost = e
            raise
        if self._hub is loop:  # ask for the next ones first: a solo pool runs each task inside `_deliver`
            self._issue_pops()
        self._deliver_held()
