"""A persistence module for the `eventsourcing` library (9.5): events in a RocketMQ store.

Select it the library's way::

    PERSISTENCE_MODULE=rmq_eventstore.eventsourcing
    ROCKETMQ_URL=file:///srv/app/var/store     # a local store (its broker process is found or started)
    # or ROCKETMQ_URL=rmq://127.0.0.1:9876      # a name server

Every key may be prefixed with the application's name (``BANKACCOUNTS_ROCKETMQ_URL``), as the library's
`Environment.get` does. Keys:

- ``ROCKETMQ_URL`` (required): ``file:///abs/path`` or ``rmq://host:port``.
- ``ROCKETMQ_EMBEDDED`` (default no): with a ``file://`` URL, serve the store from a broker thread in this
  process (`serve_in_thread`) when no broker serves it yet; other processes then find that broker.
- ``ROCKETMQ_BROKER_OPTIONS``: JSON object of store/broker settings for a broker started here (embedded or
  a broker process started on demand), e.g. ``{"mapped_file_size_commit_log": 67108864}``. Brokers started
  here keep events forever unless told otherwise (``file_reserved_time`` 10 years, no forced cleaning).
- ``ROCKETMQ_TOPIC``: the application's topic; default ``ES_`` + the application name, escaped (see
  `topic_for`). Snapshots (and any other purpose) go to ``<topic>--<purpose>``.
- ``CREATE_TOPIC`` (default yes; ``CREATE_TABLE`` is read when it is unset): create missing topics.
- ``ROCKETMQ_ACCESS_KEY`` / ``ROCKETMQ_SECRET_KEY``: credentials for a broker with ACL on.

Layout (DESIGN.md, "The eventsourcing persistence module"): an application's stored events are the
messages of queue 0 of its topic, so notification id = queue offset + 1 (contiguous, and never interleaved:
a batch is appended under the store's put lock with consecutive queue offsets). Each aggregate is a stream
(stream id = originator id) and every insert is one multi-stream batch whose expected versions are checked
by the broker under its stream locks, all or nothing, with the process recorder's tracking record, on queue
1 of the same topic, in the same batch. A lost race is a `ConcurrencyError` of that append, which becomes
the library's `IntegrityError`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any
from uuid import UUID

from eventsourcing.persistence import (
    AggregateRecorder,
    ApplicationRecorder,
    DataError,
    InfrastructureFactory,
    IntegrityError,
    InterfaceError,
    Notification,
    NotSupportedError,
    OperationalError,
    PersistenceError,
    ProcessRecorder,
    ProgrammingError,
    Queue,
    ShutDown,
    StoredEvent,
    Subscription,
    Tracking,
    TrackingRecorder,
)
from eventsourcing.utils import Environment, resolve_topic, strtobool

from .client import (
    FOUND,
    NO_MATCHED_MSG,
    NO_NEW_MSG,
    Admin,
    ConcurrencyError,
    ExtensionNotSupportedError,
    LocalBrokerError,
    Message,
    MessageExt,
    MQBrokerError,
    Producer,
    PullConsumer,
    RemotingError,
    SendResult,
    find_local_broker,
    parse_url,
    resolve_namesrv,
)
from .common.stream import MAX_STREAM_ID_LENGTH
from .common.topic import TOPIC_MAX_LENGTH, TopicValidationError, validate_topic

__all__ = [
    "EVENTS_QUEUE", "TRACKING_QUEUE", "RocketMQAggregateRecorder", "RocketMQApplicationRecorder",
    "RocketMQFactory", "RocketMQProcessRecorder", "RocketMQSubscription", "RocketMQTrackingRecorder",
    "application_name_of", "topic_for",
]

EVENTS_QUEUE = 0  # an application's stored events: notification id = queue offset + 1
TRACKING_QUEUE = 1  # tracking records (their own streams), kept out of the notification sequence
TOPIC_PREFIX = "ES_"
PURPOSE_SEPARATOR = "--"
TRACKING_STREAM_PREFIX = "%TRACKING%"
READER_GROUP = "ES_NOTIFICATION_READERS"
PROPERTY_ORIGINATOR_VERSION = "ORIGINATOR_VERSION"
PROPERTY_ORIGINATOR_ID_TYPE = "ORIGINATOR_ID_TYPE"  # "uuid" when the originator id was a UUID
PROPERTY_TRACKING_APPLICATION = "TRACKING_APPLICATION"
PROPERTY_TRACKING_NOTIFICATION_ID = "TRACKING_NOTIFICATION_ID"
TRACKING_TAG = "eventsourcing-tracking"
MAX_PULL = 32  # what one pull returns at most (the broker's maxTransferCountOnMessageInMemory)
SUBSCRIPTION_LONG_POLL_MS = 1000  # how long the broker holds a subscription's pull when there is nothing new
CATCH_UP_POLL_MS = 2000  # a read below what this process wrote waits for the broker's dispatch this long
MAX_APPEND_ATTEMPTS = 16  # conflicts on a stream that moved without a duplicate: re-read and try again
VERSION_CACHE_SIZE = 100_000
DEFAULT_BROKER_OPTIONS: dict[str, Any] = {
    "file_reserved_time": 24 * 365 * 10,  # an event store keeps its events: no expiry by age
    "clean_file_forcibly_enable": False,  # nor by disk pressure (a full disk refuses writes instead)
}
_HEX = "0123456789ABCDEF"

# RocketMQ response codes (remoting.ResponseCode) that say something about the caller's request
_CODE_DATA = {13}  # MESSAGE_ILLEGAL
_CODE_PROGRAMMING = {16, 17}  # NO_PERMISSION, TOPIC_NOT_EXIST
_CODE_NOT_SUPPORTED = {25}  # REQUEST_CODE_NOT_SUPPORTED


# -- names ------------------------------------------------------------------------------------------------
def _escape(text: str) -> str:
    """`[A-Za-z0-9_]` as they are; every other character as `-XX` per UTF-8 byte (upper-case hex). A
    prefix code: reversible, so two names never share a topic."""
    out = []
    for ch in text:
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            out.append(ch)
        else:
            out.extend(f"-{_HEX[b >> 4]}{_HEX[b & 15]}" for b in ch.encode("utf-8"))
    return "".join(out)


def _unescape(text: str) -> str:
    raw = bytearray()
    i = 0
    while i < len(text):
        if text[i] == "-":
            raw.append(int(text[i + 1:i + 3], 16))
            i += 3
        else:
            raw += text[i].encode()
            i += 1
    return raw.decode("utf-8")


def topic_for(application_name: str, purpose: str = "events", base: str | None = None) -> str:
    """The topic of an application's events (``ES_<escaped name>``, or `base`) or of another purpose
    (``<topic>--<escaped purpose>``). Raises `ProgrammingError` when it would break RocketMQ's rules (more
    than 127 characters: set ``ROCKETMQ_TOPIC``)."""
    topic = base if base else TOPIC_PREFIX + _escape(application_name)
    if purpose != "events":
        topic += PURPOSE_SEPARATOR + _escape(purpose)
    try:
        validate_topic(topic)
    except TopicValidationError as e:
        raise ProgrammingError(f"application {application_name!r} ({purpose}) cannot be stored on topic "
                               f"{topic!r}: {e}; set ROCKETMQ_TOPIC to a shorter legal name") from None
    if len(topic) > TOPIC_MAX_LENGTH:  # pragma: no cover (validate_topic says so first)
        raise ProgrammingError(f"topic {topic!r} is too long")
    return topic


def application_name_of(topic: str) -> tuple[str, str]:
    """(application name, purpose) of a topic named by `topic_for` with the default prefix."""
    if not topic.startswith(TOPIC_PREFIX):
        raise ValueError(f"{topic!r} is not an eventsourcing topic (no {TOPIC_PREFIX!r} prefix)")
    name, sep, purpose = topic[len(TOPIC_PREFIX):].partition(PURPOSE_SEPARATOR)
    return _unescape(name), _unescape(purpose) if sep else "events"


def _stream_of(originator_id: UUID | str) -> str:
    stream = str(originator_id)
    if not stream or len(stream.encode()) > MAX_STREAM_ID_LENGTH or any(
            c.isspace() or c in "\x01\x02" for c in stream):
        raise DataError(f"originator id {stream!r} cannot be a stream id (1 to {MAX_STREAM_ID_LENGTH} UTF-8 bytes, "
                        "no blanks or control separators)")
    if stream.startswith(TRACKING_STREAM_PREFIX):
        raise DataError(f"originator id {stream!r}: ids starting with {TRACKING_STREAM_PREFIX!r} are reserved")
    return stream


def _tracking_stream(application_name: str) -> str:
    return TRACKING_STREAM_PREFIX + _escape(application_name)


# -- errors -----------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _errors(what: str) -> Iterator[None]:
    """Map the client's failures onto the library's PEP 249 hierarchy, saying what was being done."""
    try:
        yield
    except PersistenceError:
        raise
    except ExtensionNotSupportedError as e:
        raise NotSupportedError(f"{what}: {e}") from e
    except MQBrokerError as e:
        if e.code in _CODE_DATA:
            raise DataError(f"{what}: the broker refused the data: {e}") from e
        if e.code in _CODE_PROGRAMMING:
            raise ProgrammingError(f"{what}: {e} (is the topic created? CREATE_TOPIC creates it)") from e
        if e.code in _CODE_NOT_SUPPORTED:
            raise NotSupportedError(f"{what}: {e}") from e
        raise OperationalError(f"{what}: the broker failed: {e}") from e
    except (RemotingError, LocalBrokerError, OSError) as e:
        raise OperationalError(f"{what}: cannot reach the broker: {type(e).__name__}: {e}") from e
    except (ValueError, TypeError) as e:
        raise InterfaceError(f"{what}: {type(e).__name__}: {e}") from e


# -- connections --------------------------------------------------------------------------------------------
class _EmbeddedBrokers:
    """Brokers this process serves (ROCKETMQ_EMBEDDED), one per store, shared by the factories using it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, tuple[Any, int]] = {}

    def acquire(self, path: str, options: dict[str, Any]) -> str:
        from .broker import serve_in_thread  # the embedded mode only: other processes never load the broker

        with self._lock:
            running = self._running.get(path)
            if running is None:
                found = find_local_broker(path)
                if found is not None:  # another process serves it: use that one
                    return found.namesrv_addr
                os.makedirs(path, exist_ok=True)
                running = (serve_in_thread(path, **options), 0)
            self._running[path] = (running[0], running[1] + 1)
            return str(running[0].namesrv_address)

    def release(self, path: str) -> None:
        with self._lock:
            running = self._running.get(path)
            if running is None:
                return
            if running[1] <= 1:
                del self._running[path]
                running[0].close()
            else:
                self._running[path] = (running[0], running[1] - 1)


_EMBEDDED = _EmbeddedBrokers()


class _Connection:
    """The clients one factory's recorders share (all thread-safe), the topics it has made sure of, and what
    this process knows of its streams: the latest (stream version, originator version) it saw of each, and
    the highest notification id it wrote per topic."""

    def __init__(self, url: str, *, embedded: bool = False, broker_options: dict[str, Any] | None = None,
                 create_topic: bool = True, access_key: str | None = None, secret_key: str | None = None) -> None:
        self.url = url
        self.create_topic = create_topic
        self._embedded_path: str | None = None
        options = {**DEFAULT_BROKER_OPTIONS, **(broker_options or {})}
        with _errors(f"opening {url}"):
            kind, value = parse_url(url)
            if kind == "file" and embedded:
                self.namesrv = _EMBEDDED.acquire(value, options)
                self._embedded_path = value
            elif kind == "file":
                self.namesrv = resolve_namesrv(url, broker_options=options)
            else:
                self.namesrv = resolve_namesrv(url)
        keys = {"access_key": access_key, "secret_key": secret_key}
        self.producer = Producer(self.namesrv, "ES_WRITERS", **keys).start()
        self.admin = Admin(self.namesrv, **keys)
        self.reader = PullConsumer(self.namesrv, READER_GROUP, **keys).start()
        self._keys = keys
        self._topics: set[str] = set()
        self._lock = threading.Lock()
        self._versions: OrderedDict[tuple[str, str], tuple[int, int]] = OrderedDict()
        self._written: dict[str, int] = {}
        self._closed = False

    def new_reader(self) -> PullConsumer:
        return PullConsumer(self.namesrv, READER_GROUP, **self._keys).start()

    def ensure_topic(self, topic: str, queues: int) -> None:
        if topic in self._topics:
            return
        with _errors(f"checking topic {topic}"):
            # (not the route: a name server with auto-creation answers unknown topics with TBW102's)
            if topic not in self.admin.topic_list():
                if not self.create_topic:
                    raise ProgrammingError(f"topic {topic} does not exist and CREATE_TOPIC is off: create it with "
                                           f"{queues} queues (rmq-eventstore or Admin.create_topic)")
                self.admin.create_topic(topic, queue_nums=queues)
        with self._lock:
            self._topics.add(topic)

    # what this process knows of streams (a hint: the broker's expected-version check decides)
    def known(self, topic: str, stream: str) -> tuple[int, int] | None:
        with self._lock:
            return self._versions.get((topic, stream))

    def learn(self, topic: str, stream: str, stream_version: int, last_value: int) -> None:
        key = (topic, stream)
        with self._lock:
            old = self._versions.get(key)
            if old is None or old[0] < stream_version:
                self._versions[key] = (stream_version, last_value)
                self._versions.move_to_end(key)
                while len(self._versions) > VERSION_CACHE_SIZE:
                    self._versions.popitem(last=False)

    def forget(self, topic: str, stream: str) -> None:
        with self._lock:
            self._versions.pop((topic, stream), None)

    def wrote(self, topic: str, notification_id: int) -> None:
        with self._lock:
            if self._written.get(topic, 0) < notification_id:
                self._written[topic] = notification_id

    def written(self, topic: str) -> int:
        with self._lock:
            return self._written.get(topic, 0)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for client in (self.reader, self.producer, self.admin):
            with contextlib.suppress(Exception):
                client.shutdown()
        if self._embedded_path is not None:
            _EMBEDDED.release(self._embedded_path)


# -- recorders ------------------------------------------------------------------------------------------------
def _version(m: MessageExt, prop: str) -> int:
    return int(m.properties[prop])


class _Recorder:
    """What every recorder shares: a connection, a topic, and conditional appends of several streams."""

    def __init__(self, connection: _Connection, topic: str, queues: int = 2) -> None:
        self.connection = connection
        self.topic = topic
        connection.ensure_topic(topic, queues)

    # reads
    def _read(self, stream: str, last: int | None = None) -> list[MessageExt]:
        with _errors(f"reading stream {stream} of {self.topic}"):
            msgs = self.connection.admin.read_stream(self.topic, stream, last=last)
        if msgs:
            m = msgs[-1]
            value = m.properties.get(PROPERTY_ORIGINATOR_VERSION) or m.properties.get(PROPERTY_TRACKING_NOTIFICATION_ID)
            if value is not None:
                self.connection.learn(self.topic, stream, _version(m, "STREAM_VERSION"), int(value))
        return msgs

    def _state(self, stream: str) -> tuple[int, int | None]:
        """(stream version, last originator version or notification id) of a stream, read from the broker."""
        msgs = self._read(stream, last=1)
        if not msgs:
            return 0, None
        m = msgs[-1]
        value = m.properties.get(PROPERTY_ORIGINATOR_VERSION) or m.properties.get(PROPERTY_TRACKING_NOTIFICATION_ID)
        return _version(m, "STREAM_VERSION"), int(value) if value is not None else None

    # writes
    def _append(self, stored_events: Sequence[StoredEvent], tracking: Tracking | None = None) -> SendResult | None:
        """Store the events (queue 0) and the tracking record (queue 1) as one batch, all or nothing.

        Within a stream, originator versions must rise (checked here); across the stored data, the new
        first version must be above the stream's last one, and the stream must still be at the version that
        last one had: the broker checks that under its stream locks (expected version). A stream that moved
        is re-read: a duplicate (or lower) version is an `IntegrityError`, anything else is tried again."""
        if not stored_events and tracking is None:
            return None
        msgs: list[Message] = []
        streams: list[str] = []
        queue_ids: list[int] = []
        firsts: dict[str, int] = {}
        lasts: dict[str, int] = {}
        for s in stored_events:
            stream = _stream_of(s.originator_id)
            v = s.originator_version
            if isinstance(v, bool) or not isinstance(v, int):
                raise DataError(f"originator version {v!r} of {stream} is not an int")
            if stream in lasts and v <= lasts[stream]:
                raise IntegrityError(f"stored events of {stream} are not unique or not in rising version order: "
                                     f"version {v} after {lasts[stream]}")
            firsts.setdefault(stream, v)
            lasts[stream] = v
            props = {PROPERTY_ORIGINATOR_VERSION: str(v)}
            if isinstance(s.originator_id, UUID):
                props[PROPERTY_ORIGINATOR_ID_TYPE] = "uuid"
            msgs.append(Message(self.topic, bytes(s.state), tags=s.topic or None, properties=props))
            streams.append(stream)
            queue_ids.append(EVENTS_QUEUE)
        if tracking is not None:
            tstream = _tracking_stream(tracking.application_name)
            firsts[tstream] = lasts[tstream] = tracking.notification_id
            msgs.append(Message(self.topic, json.dumps({"application_name": tracking.application_name,
                                                        "notification_id": tracking.notification_id}).encode(),
                                tags=TRACKING_TAG, properties={
                                    PROPERTY_TRACKING_APPLICATION: tracking.application_name,
                                    PROPERTY_TRACKING_NOTIFICATION_ID: str(tracking.notification_id)}))
            streams.append(tstream)
            queue_ids.append(TRACKING_QUEUE)
        conn = self.connection
        expected: dict[str, int] = {}
        for stream, first in firsts.items():
            known = conn.known(self.topic, stream)
            if known is None and stream.startswith(TRACKING_STREAM_PREFIX):
                known = self._state(stream)  # tracking records follow ones this process may not have seen
            expected[stream] = self._check(stream, first, known)
        for _attempt in range(MAX_APPEND_ATTEMPTS):
            try:
                with _errors(f"appending {len(msgs)} records to {self.topic}"):
                    result = conn.producer.append_streams(msgs, streams, expected, queue_id=queue_ids[0],
                                                          queue_ids=queue_ids)
            except ConcurrencyError as e:
                stream = e.stream if e.stream in expected else next(iter(expected))
                expected[stream] = self._check(stream, firsts[stream], self._state(stream))
                continue
            if result.status != "SEND_OK":
                raise OperationalError(f"the events were stored on {self.topic} but the broker answered "
                                       f"{result.status} (not confirmed on disk)")
            for stream, version in (result.stream_versions or {}).items():
                conn.learn(self.topic, stream, version, lasts[stream])
            return result
        raise OperationalError(f"could not append to {self.topic}: its streams kept moving "
                               f"({MAX_APPEND_ATTEMPTS} attempts)")

    def _check(self, stream: str, first: int, known: tuple[int, int | None] | None) -> int:
        """The expected version of an append to `stream` starting at `first`, or IntegrityError."""
        if known is None:
            return 0  # a new aggregate, most likely; the broker says otherwise if it is not
        version, last = known
        if last is not None and first <= last:
            if stream.startswith(TRACKING_STREAM_PREFIX):
                raise IntegrityError(f"tracking notification id {first} not greater than the current max "
                                     f"{last} of {stream[len(TRACKING_STREAM_PREFIX):]} on {self.topic}")
            raise IntegrityError(f"stored event {stream} version {first} already recorded (or not after the "
                                 f"last one, version {last}) on {self.topic}")
        return version


class RocketMQAggregateRecorder(_Recorder, AggregateRecorder):
    """Stored events of aggregates: each aggregate is a stream of the topic, read back through the index."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        self._append(stored_events)
        return None

    def select_events(self, originator_id: UUID | str, *, gt: int | None = None, lte: int | None = None,
                      desc: bool = False, limit: int | None = None) -> Sequence[StoredEvent]:
        stream = _stream_of(originator_id)
        if desc and limit is not None and lte is None:
            msgs = self._read(stream, last=max(limit, 1))  # the newest ones (the last snapshot, say)
        else:
            msgs = self._read(stream)
        out = []
        for m in msgs:
            v = _version(m, PROPERTY_ORIGINATOR_VERSION)
            if (gt is not None and v <= gt) or (lte is not None and v > lte):
                continue
            out.append(StoredEvent(originator_id=originator_id, originator_version=v, topic=m.tags or "",
                                   state=bytes(m.body)))
        if desc:
            out.reverse()
        return out[:limit] if limit is not None else out


def _notification(m: MessageExt) -> Notification:
    p = m.properties
    stream = p.get("STREAM_ID", "")
    oid: UUID | str = UUID(stream) if p.get(PROPERTY_ORIGINATOR_ID_TYPE) == "uuid" else stream
    return Notification(id=m.queue_offset + 1, originator_id=oid, originator_version=int(p[PROPERTY_ORIGINATOR_VERSION]),
                        topic=m.tags or "", state=bytes(m.body))


class RocketMQApplicationRecorder(RocketMQAggregateRecorder, ApplicationRecorder):
    """Aggregate events plus the application sequence: queue 0 of the topic, notification id = offset + 1."""

    def insert_events(self, stored_events: Sequence[StoredEvent], **kwargs: Any) -> Sequence[int] | None:
        result = self._append(stored_events, kwargs.get("tracking"))
        if result is None or not stored_events:
            return []
        first = result.queue_offset + 1
        ids = list(range(first, first + len(stored_events)))
        self.connection.wrote(self.topic, ids[-1])
        return ids

    def select_notifications(self, start: int | None, limit: int, stop: int | None = None,
                             topics: Sequence[str] = (), *, inclusive_of_start: bool = True) -> Sequence[Notification]:
        if start is None:
            first = 1
        else:
            first = start if inclusive_of_start else start + 1
        offset = max(first, 1) - 1
        expression = " || ".join(topics) if topics else "*"
        wanted = set(topics)
        written = self.connection.written(self.topic)
        out: list[Notification] = []
        reader = self.connection.reader
        waited = False
        while len(out) < limit and (stop is None or offset < stop):
            # below what this process wrote, a read waits for the broker's dispatch (long polling) rather
            # than missing an event that was stored a moment ago
            wait = CATCH_UP_POLL_MS if offset < written and not waited else 0
            with _errors(f"reading notifications of {self.topic}"):
                r = reader.pull(self.topic, EVENTS_QUEUE, offset, min(MAX_PULL, limit - len(out)),
                                suspend_timeout_ms=wait, expression=expression)
            if r.status == FOUND:
                for m in r.messages:
                    n = m.queue_offset + 1
                    if stop is not None and n > stop:
                        return out
                    if wanted and (m.tags or "") not in wanted:
                        continue
                    out.append(_notification(m))
                    if len(out) >= limit:
                        return out
            elif r.status == NO_NEW_MSG:
                if not wait:
                    break
                waited = True
                continue
            elif r.status != NO_MATCHED_MSG:  # OFFSET_ILLEGAL: expired by retention, or past the end
                if offset < r.min_offset:
                    raise OperationalError(f"notifications {offset + 1}..{r.min_offset} of {self.topic} are no "
                                           "longer in the store (expired files)")
                break
            if r.next_begin_offset <= offset:
                break
            offset = r.next_begin_offset
        return out

    def max_notification_id(self) -> int | None:
        with _errors(f"reading the max offset of {self.topic}"):
            stored = self.connection.admin.max_offset(self.topic, EVENTS_QUEUE)
        return max(stored, self.connection.written(self.topic)) or None

    def subscribe(self, gt: int | None = None, topics: Sequence[str] = ()) -> Subscription[ApplicationRecorder]:
        return RocketMQSubscription(self, gt=gt, topics=topics)


class RocketMQSubscription(Subscription[RocketMQApplicationRecorder]):
    """Notifications after `gt`, from a thread that tails queue 0 with long-polling pulls: the broker holds
    each pull until a message is dispatched (or a second passes), so a new event wakes the subscriber at
    once and an idle one costs one request a second. It has its own consumer, whose shutdown ends a held
    pull when the subscription stops."""

    def __init__(self, recorder: RocketMQApplicationRecorder, gt: int | None = None, topics: Sequence[str] = ()) -> None:
        super().__init__(recorder=recorder, gt=gt, topics=topics)
        self._batches: Queue[list[Notification]] = Queue(maxsize=10)
        self._batch: list[Notification] = []
        self._index = 0
        self._thread_error: BaseException | None = None
        self._consumer = recorder.connection.new_reader()
        self._thread = threading.Thread(target=self._run, name=f"es-subscription-{recorder.topic}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        recorder = self._recorder
        floor = self._last_notification_id or 0
        offset = floor
        expression = " || ".join(self._topics) if self._topics else "*"
        wanted = set(self._topics)
        try:
            while not self._has_been_stopped:
                with _errors(f"tailing {recorder.topic}"):
                    r = self._consumer.pull(recorder.topic, EVENTS_QUEUE, offset, MAX_PULL,
                                            suspend_timeout_ms=SUBSCRIPTION_LONG_POLL_MS, expression=expression)
                if r.status == FOUND:
                    batch = [_notification(m) for m in r.messages if m.queue_offset + 1 > floor
                             and (not wanted or (m.tags or "") in wanted)]
                    if batch:
                        self._batches.put(batch)
                elif r.status not in (NO_NEW_MSG, NO_MATCHED_MSG) and offset > r.max_offset:
                    offset = r.max_offset  # `gt` beyond the end: wait at the end, deliver only ids above it
                    continue
                offset = max(r.next_begin_offset, offset) if r.status != NO_NEW_MSG else offset
        except ShutDown:
            pass
        except BaseException as e:
            if not self._has_been_stopped and self._thread_error is None:
                self._thread_error = e
            self.stop()

    def stop(self) -> None:
        super().stop()
        self._batches.shutdown(immediate=True)
        threading.Thread(target=self._consumer.shutdown, daemon=True).start()  # ends a held pull

    def __exit__(self, *args: object, **kwargs: Any) -> None:
        try:
            super().__exit__(*args, **kwargs)
        finally:
            self._thread.join(timeout=SUBSCRIPTION_LONG_POLL_MS / 1000 + 5)

    def __next__(self) -> Notification:
        if self._index == len(self._batch) and not self._has_been_stopped:
            try:
                self._batch = self._batches.get()
                self._index = 0
            except ShutDown:
                pass
        if self._has_been_stopped:
            if self._thread_error is not None:
                raise self._thread_error
            raise StopIteration
        n = self._batch[self._index]
        self._index += 1
        return n


class RocketMQTrackingRecorder(_Recorder, TrackingRecorder):
    """Tracking records: one stream per upstream application on queue 1 of the topic; a record is appended
    only above the stream's last notification id (checked with the stream's expected version)."""

    def insert_tracking(self, tracking: Tracking) -> None:
        self._append((), tracking)

    def max_tracking_id(self, application_name: str) -> int | None:
        return self._state(_tracking_stream(application_name))[1]


class RocketMQProcessRecorder(RocketMQTrackingRecorder, RocketMQApplicationRecorder, ProcessRecorder):
    """Events and the tracking record of the notification that caused them, in one batch (all or nothing)."""


# -- factory ----------------------------------------------------------------------------------------------------
class RocketMQFactory(InfrastructureFactory[RocketMQTrackingRecorder]):
    """`InfrastructureFactory` of this module (see the module docstring for the environment keys)."""

    ROCKETMQ_URL = "ROCKETMQ_URL"
    ROCKETMQ_EMBEDDED = "ROCKETMQ_EMBEDDED"
    ROCKETMQ_BROKER_OPTIONS = "ROCKETMQ_BROKER_OPTIONS"
    ROCKETMQ_TOPIC = "ROCKETMQ_TOPIC"
    ROCKETMQ_ACCESS_KEY = "ROCKETMQ_ACCESS_KEY"
    ROCKETMQ_SECRET_KEY = "ROCKETMQ_SECRET_KEY"
    CREATE_TOPIC = "CREATE_TOPIC"

    aggregate_recorder_class = RocketMQAggregateRecorder
    application_recorder_class = RocketMQApplicationRecorder
    tracking_recorder_class = RocketMQTrackingRecorder
    process_recorder_class = RocketMQProcessRecorder

    def __init__(self, env: Environment | Any | None) -> None:
        super().__init__(env)
        url = self.env.get(self.ROCKETMQ_URL)
        if not url:
            raise OSError(f"{self.ROCKETMQ_URL} is not set: give file:///path/to/store for a local store or "
                          f"rmq://host:9876 for a name server (optionally prefixed with the application name: "
                          f"{self.env.name.upper()}_{self.ROCKETMQ_URL})")
        try:
            options = json.loads(self.env.get(self.ROCKETMQ_BROKER_OPTIONS) or "{}")
            if not isinstance(options, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            raise OSError(f"{self.ROCKETMQ_BROKER_OPTIONS} must be a JSON object of store/broker settings: {e}") from None
        create = self.env.get(self.CREATE_TOPIC) or self.env.get("CREATE_TABLE") or "yes"
        self._connection = _Connection(
            url, embedded=strtobool(self.env.get(self.ROCKETMQ_EMBEDDED) or "no"), broker_options=options,
            create_topic=strtobool(create), access_key=self.env.get(self.ROCKETMQ_ACCESS_KEY) or None,
            secret_key=self.env.get(self.ROCKETMQ_SECRET_KEY) or None)

    @property
    def connection(self) -> _Connection:
        return self._connection

    def _topic(self, purpose: str = "events") -> str:
        return topic_for(self.env.name, purpose, self.env.get(self.ROCKETMQ_TOPIC) or None)

    def aggregate_recorder(self, purpose: str = "events") -> AggregateRecorder:
        return self.aggregate_recorder_class(self._connection, self._topic(purpose), 2 if purpose == "events" else 1)

    def application_recorder(self) -> ApplicationRecorder:
        topic = self.env.get(self.APPLICATION_RECORDER_TOPIC)
        cls = resolve_topic(topic) if topic else self.application_recorder_class
        return cls(self._connection, self._topic())

    def tracking_recorder(self, tracking_recorder_class: type[RocketMQTrackingRecorder] | None = None
                          ) -> RocketMQTrackingRecorder:
        if tracking_recorder_class is None:
            topic = self.env.get(self.TRACKING_RECORDER_TOPIC)
            tracking_recorder_class = resolve_topic(topic) if topic else self.tracking_recorder_class
        assert tracking_recorder_class is not None
        return tracking_recorder_class(self._connection, self._topic())

    def process_recorder(self) -> ProcessRecorder:
        topic = self.env.get(self.PROCESS_RECORDER_TOPIC)
        cls = resolve_topic(topic) if topic else self.process_recorder_class
        return cls(self._connection, self._topic())

    def close(self) -> None:
        self._connection.close()
        super().close()


Factory = RocketMQFactory
