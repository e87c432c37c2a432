"""`Producer`: sends messages and batches over SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE, as
`DefaultMQProducer` does (UNIQ_KEY per message, round-robin over the topic's writeable queues,
one retry on another queue when a broker cannot be reached)."""

from __future__ import annotations

import itertools
import json
import time
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from ..common import Message, codec
from ..common.properties import (
    PROPERTY_BATCH_QUEUE_ID,
    PROPERTY_STREAM_ID,
    PROPERTY_TIMER_DELIVER_MS,
    set_property,
)
from ..common.small_ints import INT_TEXT, TEXT_INT
from ..common.stream import validate_stream_id
from ..common.topic import AUTO_CREATE_TOPIC_KEY_TOPIC, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode, next_opaque
from ..remoting.command import OPAQUES
from .base import ROUTE_TTL_SECONDS, ClientBase
from .remoting_client import MQBrokerError, RemotingError, RemotingTimeoutError, client_lone

_SEND_STATUS = {
    ResponseCode.SUCCESS: "SEND_OK",
    ResponseCode.FLUSH_DISK_TIMEOUT: "FLUSH_DISK_TIMEOUT",
    ResponseCode.FLUSH_SLAVE_TIMEOUT: "FLUSH_SLAVE_TIMEOUT",
    ResponseCode.SLAVE_NOT_AVAILABLE: "SLAVE_NOT_AVAILABLE",
}
_OK_CODES = tuple(_SEND_STATUS)
_VALID_TOPICS_MAX = 1024  # topic names `send` remembers as validated (then it starts over)
_STREAM_OK_CODES = (*_OK_CODES, ResponseCode.STREAM_VERSION_CONFLICT)
_SEND_V2 = RequestCode.SEND_MESSAGE_V2
_monotonic = time.monotonic

# A plain single send in C (issue 16, branch client-send): its request frame from the Message's fields in one
# call (`client_send_frame`) and a lone caller's SUCCESS response read without a RemotingCommand
# (`client_send_take`). None without the extension (or under RMQ_EVENTSTORE_PURE=1): the Python path below,
# which stays the definition of the bytes (tests/test_client_send_native.py compares them).
_native = codec.native if codec.native is not None and hasattr(codec.native, "client_send_frame") else None
_send_frame = _native.client_send_frame if _native is not None else None
_send_take = _native.client_send_take if _native is not None else None
_lone = client_lone if _send_take is not None else None  # ClientConnection.invoke_frame's lone caller in C
_uniq_create = getattr(codec.native, "uniq_create", None)  # UniqueIdGenerator.create's C fast path (None: declined)
_FAST_BASES: dict[type, bool] = {}  # client base class -> whether send's fast path may bypass its invoke/route


def _fast_base(cls: type) -> bool:
    """Whether `cls` (a Producer's `_base`) invokes and routes as ClientBase does, so that `send` may read its
    route cache and connection pool directly (a base that overrides either, or a test's stand-in, may not)."""
    ok = _FAST_BASES.get(cls)
    if ok is None:
        ok = _FAST_BASES[cls] = (isinstance(cls, type) and issubclass(cls, ClientBase)
                                 and cls.invoke is ClientBase.invoke and cls.route is ClientBase.route)
    return ok


def _deliver_ms(deliver_at: datetime | int | None, delay: timedelta | None) -> int | None:
    """Epoch milliseconds of a timer message's delivery, from an aware datetime, epoch ms, or a delay."""
    if deliver_at is not None and delay is not None:
        raise ValueError("give deliver_at or delay, not both")
    if delay is not None:
        if not isinstance(delay, timedelta):
            raise TypeError(f"delay must be a timedelta, not {type(delay).__name__}")
        return int(time.time() * 1000) + int(delay.total_seconds() * 1000)
    if deliver_at is None:
        return None
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise ValueError("deliver_at must be an aware datetime (with a tzinfo), so its instant is unambiguous")
        return int(deliver_at.timestamp() * 1000)
    if isinstance(deliver_at, bool) or not isinstance(deliver_at, int):
        raise TypeError(f"deliver_at must be an aware datetime or epoch milliseconds, not {type(deliver_at).__name__}")
    return deliver_at


class ConcurrencyError(Exception):
    """An expected-version append found the stream at another version; nothing was stored.

    `current_version` is the stream's version when the broker refused; while an open transaction holds the
    stream it is the version that transaction reserved (append again after it ends)."""

    def __init__(self, message: str, stream: str, expected_version: int | None, current_version: int | None) -> None:
        super().__init__(message)
        self.stream = stream
        self.expected_version = expected_version
        self.current_version = current_version


class ExtensionNotSupportedError(Exception):
    """The broker lacks an rmq_eventstore extension (an Apache RocketMQ broker, say); nothing was sent."""


@dataclass
class SendResult:
    """`SendResult`: status (SEND_OK, FLUSH_DISK_TIMEOUT, ...), msg_id (UNIQ_KEY; comma-joined for a
    batch), offset_msg_id (the broker's id: store host + commitlog offset), queue and queue offset."""

    status: str
    msg_id: str
    offset_msg_id: str
    queue_id: int
    queue_offset: int
    topic: str = ""
    broker_address: str = ""
    stream_version: int | None = None  # the version of the (last) event, for a stream append
    # stream -> its last version, for a multi-stream append (keyword-only: subclasses add positional fields)
    stream_versions: dict[str, int] | None = field(default=None, kw_only=True)


class Producer:
    """Sends `rmq_eventstore.store.Message`s to the brokers of their topic; thread-safe."""

    def __init__(self, namesrv_addr: str, group: str = "DEFAULT_PRODUCER", send_timeout_ms: int = 3000,
                 retry_times_when_send_failed: int = 2, max_message_size: int = 4 * 1024 * 1024,
                 access_key: str | None = None, secret_key: str | None = None) -> None:
        """`access_key` and `secret_key` sign every request for a broker with ACL on."""
        self.group = group
        self.max_message_size = max_message_size
        self._base = self._make_base(namesrv_addr, send_timeout_ms / 1000.0, access_key, secret_key)
        self.retry_times_when_send_failed = retry_times_when_send_failed
        self._ids = codec.UniqueIdGenerator()
        self._rr = itertools.count()
        self._valid_topics: set[str] = set()  # topics `send` validated already (a name stays valid)

    def _make_base(self, namesrv_addr: str, timeout: float, access_key: str | None,
                   secret_key: str | None) -> ClientBase:
        return _ProducerBase(namesrv_addr, self, timeout, access_key, secret_key)

    @property
    def client_id(self) -> str:
        return self._base.client_id

    def start(self) -> Producer:
        self._base.start()
        return self

    def shutdown(self) -> None:
        self._base.shutdown()

    def __enter__(self) -> Producer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def refresh_route(self, topic: str) -> None:
        """Forget the cached route of `topic` and ask the name server again (after its queues changed)."""
        self._base.route(topic, refresh=True)

    def _properties(self, msg: Message, uniq: str, delay_level: int) -> tuple[str, str]:
        """The properties string to send and the UNIQ_KEY (client message id) it carries."""
        if msg.properties_string is not None:
            ps = msg.properties_string
            if "UNIQ_KEY\x01" not in ps:
                ps = (ps if not ps or ps.endswith("\x02") else ps + "\x02") + f"UNIQ_KEY\x01{uniq}\x02"
            else:
                uniq = codec.string_to_properties(ps).get("UNIQ_KEY") or uniq
        else:
            uniq = msg.uniq_key or uniq
            ps = codec.build_properties_string(msg, uniq)
        if "WAIT\x01" not in ps:
            ps += "WAIT\x01true\x02"
        if delay_level > 0:
            ps = codec.delete_property(ps, "DELAY")
            ps = (ps if not ps or ps.endswith("\x02") else ps + "\x02") + f"DELAY\x01{delay_level}\x02"
        return ps, uniq

    def _pick(self, topic: str, queue_id: int | None, avoid: str | None) -> tuple[str, int]:
        route = self._base.route(topic)
        if not route.queues:
            raise MQBrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} has no writeable queue")
        if queue_id is not None:
            for addr, q in route.queues:
                if q == queue_id:
                    return addr, q
            raise ValueError(f"topic {topic!r} has no writeable queue {queue_id}")
        n = len(route.queues)
        start = next(self._rr)
        for i in range(n):
            addr, q = route.queues[(start + i) % n]
            if addr != avoid:
                return addr, q
        return route.queues[start % n]

    def send(self, msg: Message, queue_id: int | None = None, delay_level: int = 0,
             timeout_ms: int | None = None, *, stream: str | None = None,
             expected_version: int | None = None, deliver_at: datetime | int | None = None,
             delay: timedelta | None = None) -> SendResult:
        """Send one message. `queue_id` (or a non-zero `msg.queue_id`) picks the queue, else round-robin;
        `delay_level` (1..18 by default: 1s 5s 10s 30s 1m ...) delays delivery. Raises `MQBrokerError`
        for a broker error and `RemotingError` when no broker can be reached.

        With `stream`, the message is the next event of that stream of its topic, numbered by the broker
        (`SendResult.stream_version`); `expected_version` (0: the stream must not exist yet) makes the
        append conditional: another current version raises `ConcurrencyError` and stores nothing. A
        stream's events go to one queue (picked from the stream id) unless `queue_id` says otherwise.

        `deliver_at` (an aware datetime, or epoch milliseconds) or `delay` (a timedelta) makes it a timer
        message (`TIMER_DELIVER_MS`): held by the broker and delivered on its topic when due, to the
        broker's `timerPrecisionMs`, at most `timerMaxDelaySec` ahead."""
        topic = msg.topic
        if topic.__class__ is not str or topic not in self._valid_topics:
            validate_topic(topic)
            if len(self._valid_topics) >= _VALID_TOPICS_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        if ((queue_id is None or queue_id.__class__ is int) and not delay_level and stream is None
                and deliver_at is None and delay is None and _send_frame is not None and msg.__class__ is Message
                and msg.properties_string is None and not msg.queue_id and msg.body.__class__ is bytes):
            # the plain send (one Python frame to the socket and back): taken when the route is cached and
            # fresh and requests are not signed, and a `queue_id` asked for is among its writeable queues
            # (the kombu transport's sends, to a queue's lane); nothing has happened yet when it is not
            queues = self._cached_queues(topic)
            if queues is not None:
                if queue_id is None:
                    return self._send_plain(msg, topic, queues, timeout_ms)
                for picked in queues:  # _pick's choice for an explicit queue: its first entry
                    if picked[1] == queue_id:
                        return self._send_plain(msg, topic, queues, timeout_ms, queue_id, picked)
        props, uniq = self._properties(msg, msg.uniq_key or self._ids.create(), delay_level)
        due = _deliver_ms(deliver_at, delay) if deliver_at is not None or delay is not None else None
        if due is not None:
            if delay_level:
                raise ValueError("give either delay_level or deliver_at/delay, not both")
            props = set_property(props, PROPERTY_TIMER_DELIVER_MS, str(due))
        q = queue_id if queue_id is not None else (msg.queue_id or None)
        body = bytes(msg.body)
        return self._send(msg.topic, q, RequestCode.SEND_MESSAGE_V2, body, props, msg.flag, msg.sys_flag,
                          msg.reconsume_times, uniq, False, timeout_ms, stream, expected_version)

    def _cached_queues(self, topic: str) -> list[tuple[str, int]] | None:
        """The writeable queues of `topic` when a request built in C may go straight to the connection (`send`'s
        plain case, `TransactionProducer.prepare`'s): a base that routes and invokes as ClientBase does, its route
        of `topic` cached and fresh, requests not signed. None: not, the general path's `_pick` and invoke."""
        base = self._base
        fast = _FAST_BASES.get(base.__class__)
        if fast or (fast is None and _fast_base(base.__class__)):
            route = base._routes.get(topic)
            if (route is not None and route.queues and _monotonic() - route.fetched < ROUTE_TTL_SECONDS
                    and base.remoting._sign is None):
                return route.queues
        return None

    def _send_plain(self, msg: Message, topic: str, queues: list[tuple[str, int]], timeout_ms: int | None,
                    queue_id: int | None = None, picked: tuple[str, int] | None = None) -> SendResult:
        """`send`'s plain case (see there), the first attempt: the same UNIQ_KEY, pick (round-robin, or
        `picked`: the route's entry of the `queue_id` asked for), request bytes and result as the general
        path, in one frame here and one in the connection. Whatever it does not cover goes on in `_send`
        from where it stands: a message the C frame declines (odd field types: on the queue picked already),
        a RemotingError (the retry on another queue, or on `queue_id` again as `_pick` does)."""
        ids = self._ids
        uniq = msg.uniq_key or (_uniq_create is not None and _uniq_create(ids)) or ids.create()
        addr, q = picked if picked is not None else queues[next(self._rr) % len(queues)]
        opaque = next(OPAQUES) & 0x7FFFFFFF
        frame = _send_frame(msg, uniq, self.group, q, opaque, None)  # type: ignore[misc]
        base = self._base
        timeout = (timeout_ms / 1000.0) if timeout_ms is not None else base.timeout
        if frame is not None:
            try:
                remoting = base.remoting
                conn = remoting._conns.get(addr)
                if conn is None or conn.closed:
                    conn = remoting.connection(addr)
                # a lone caller's round trip in one C call (`client_lone`; None: nothing sent, invoke_frame's)
                r = _lone(conn, frame, opaque, _SEND_V2, timeout, _send_take) if _lone is not None else None
                if r is None:
                    r = conn.invoke_frame(frame, opaque, _SEND_V2, timeout, _send_take)
            except RemotingError as e:
                if isinstance(e, RemotingTimeoutError):
                    raise  # the call's timeout is spent: not sent again (see `_send`)
                if self.retry_times_when_send_failed > 0:
                    base.route(topic, refresh=True)
                props, uniq = self._properties(msg, uniq, 0)
                return self._send(topic, queue_id, _SEND_V2, msg.body, props, msg.flag, msg.sys_flag,
                                  msg.reconsume_times, uniq, False, timeout_ms, failed=(addr, e))
            if r.__class__ is tuple:  # a SUCCESS response: (msgId, queue id or None, queue offset)
                return SendResult("SEND_OK", uniq, r[0], q if r[1] is None else r[1], r[2], topic, addr, None)
            if r.code not in _OK_CODES:
                raise MQBrokerError(r.code, r.remark, addr)
            return self._result(r, q, uniq, topic, addr, None, None)
        props, uniq = self._properties(msg, uniq, 0)
        return self._send(topic, queue_id, _SEND_V2, msg.body, props, msg.flag, msg.sys_flag, msg.reconsume_times,
                          uniq, False, timeout_ms, picked=(addr, q))

    def send_batch(self, msgs: Sequence[Message], queue_id: int | None = None,
                   timeout_ms: int | None = None, *, stream: str | None = None,
                   expected_version: int | None = None) -> SendResult:
        """Send messages of one topic as one SEND_BATCH_MESSAGE: one queue, consecutive queue offsets.
        With `stream`, they are the stream's next events, all or none (see `send`)."""
        if not msgs:
            raise ValueError("send_batch needs at least one message")
        topic = msgs[0].topic
        validate_topic(topic)
        if any(m.topic != topic for m in msgs):
            raise ValueError("all messages of a batch must have the same topic")
        uniqs = self._ids.create_many(len(msgs))
        fast = codec.encode_batch_messages(msgs, uniqs)  # the C loop, None when a message needs the reference
        body, ids = fast if fast is not None else self._batch_body_py(msgs, uniqs)
        q = queue_id if queue_id is not None else (msgs[0].queue_id or None)
        if len(body) > self.max_message_size:  # DefaultMQProducer's checkMessage on the encoded batch
            raise ValueError(f"the batch is {len(body)} bytes encoded, more than max_message_size "
                             f"{self.max_message_size}: split it into smaller batches")
        return self._send(topic, q, RequestCode.SEND_BATCH_MESSAGE, body, "", 0, 0, 0, ",".join(ids), True,
                          timeout_ms, stream, expected_version)

    def _batch_body_py(self, msgs: Sequence[Message], uniqs: list[str]) -> tuple[bytes, list[str]]:
        """`send_batch`'s body and client message ids in Python (the reference of
        `codec.encode_batch_messages`): each message's properties (`_properties`) and its inner message."""
        parts = []
        ids = []
        for m, u in zip(msgs, uniqs, strict=True):
            ps, u = self._properties(m, m.uniq_key or u, 0)
            parts.append((bytes(m.body), m.flag, ps))
            ids.append(u)
        return codec.encode_batch_body(parts), ids

    def append_streams(self, msgs: Sequence[Message], streams: Sequence[str],
                       expected_versions: Mapping[str, int | None] | None = None, *, queue_id: int = 0,
                       queue_ids: Sequence[int | None] | None = None, timeout_ms: int | None = None) -> SendResult:
        """Append messages of one topic to several streams at once, all or nothing (our extension,
        `multiStreamAppend`): `streams[i]` is the stream of `msgs[i]`; `expected_versions` maps a stream to
        the version it must be at (0: must not exist yet; missing or None: no check). Every check is made
        under the broker's stream locks before anything is stored; one conflict raises `ConcurrencyError`
        (naming that stream) and stores nothing. The messages go, in this order, to `queue_id`, or each to
        `queue_ids[i]` when given and not None; queue offsets are consecutive per queue, and
        `SendResult.queue_offset` is the first message's. `SendResult.stream_versions` gives each stream's
        last version. Never retried after a lost connection (it may have been stored). Raises
        `ExtensionNotSupportedError` against a broker without the extension."""
        if not msgs:
            raise ValueError("append_streams needs at least one message")
        if len(streams) != len(msgs) or (queue_ids is not None and len(queue_ids) != len(msgs)):
            raise ValueError("give one stream (and one queue id, with queue_ids) per message")
        topic = msgs[0].topic
        validate_topic(topic)
        if any(m.topic != topic for m in msgs):
            raise ValueError("all messages of a batch must have the same topic")
        expected = dict.fromkeys(streams)
        for st, v in (expected_versions or {}).items():
            if st not in expected:
                raise ValueError(f"expected_versions names stream {st!r}, which has no message")
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
                raise ValueError(f"expected version of {st!r} must be an int >= 0 or None, not {v!r}")
            expected[st] = v
        for st in expected:
            validate_stream_id(st)
        uniqs = self._ids.create_many(len(msgs))
        parts = []
        ids = []
        for i, (m, u) in enumerate(zip(msgs, uniqs, strict=True)):
            ps, u = self._properties(m, m.uniq_key or u, 0)
            ps = set_property(ps, PROPERTY_STREAM_ID, streams[i])
            q = queue_ids[i] if queue_ids is not None else None
            if q is not None and q != queue_id:
                ps = set_property(ps, PROPERTY_BATCH_QUEUE_ID, str(q))
            parts.append((bytes(m.body), m.flag, ps))
            ids.append(u)
        body = codec.encode_batch_body(parts)
        if len(body) > self.max_message_size:
            raise ValueError(f"the batch is {len(body)} bytes encoded, more than max_message_size "
                             f"{self.max_message_size}: split it into smaller batches")
        timeout = (timeout_ms / 1000.0) if timeout_ms is not None else self._base.timeout
        addr, q = self._pick(topic, queue_id, None)
        if not self.supports(addr, "multiStreamAppend"):
            raise ExtensionNotSupportedError(
                f"the broker at {addr} does not serve multi-stream appends (an Apache RocketMQ broker, or an "
                "older rmq_eventstore?): nothing was sent")
        ext = {"a": self.group, "b": topic, "c": AUTO_CREATE_TOPIC_KEY_TOPIC, "d": 4, "e": q, "f": 0,
               "g": int(time.time() * 1000), "h": 0, "i": "", "j": 0, "k": False, "m": True,
               "streams": json.dumps(expected, separators=(",", ":"))}
        cmd = RemotingCommand.request(RequestCode.SEND_BATCH_MESSAGE, ext, body)
        r = self._base.invoke(addr, cmd, timeout, ok=_STREAM_OK_CODES)
        x = r.ext_fields
        if r.code == ResponseCode.STREAM_VERSION_CONFLICT:
            current = x.get("currentVersion")
            stream = x.get("streamId", "")
            raise ConcurrencyError(r.remark or "stream version conflict", stream, expected.get(stream),
                                   int(current) if current is not None else None)
        versions = {k: int(v) for k, v in json.loads(x.get("streamVersions") or "{}").items()}
        return SendResult(_SEND_STATUS[r.code], ",".join(ids), x.get("msgId", ""), int(x.get("queueId", q)),
                          int(x.get("queueOffset", -1)), topic, addr, None, stream_versions=versions)

    def _stream_queue(self, topic: str, stream: str) -> int:
        """The queue of a stream: the same for every append, so a stream's events keep their order."""
        route = self._base.route(topic)
        if not route.queues:
            raise MQBrokerError(ResponseCode.TOPIC_NOT_EXIST, f"topic {topic} has no writeable queue")
        return route.queues[zlib.crc32(stream.encode()) % len(route.queues)][1]

    def supports(self, address: str, extension: str) -> bool:
        """Whether the broker at `address` serves one of rmq_eventstore's extensions (asked once, cached)."""
        return self._base.supports(address, extension)

    def _send(self, topic: str, queue_id: int | None, code: int, body: bytes, props: str, flag: int,
              sys_flag: int, reconsume: int, msg_id: str, batch: bool, timeout_ms: int | None,
              stream: str | None = None, expected_version: int | None = None,
              while_waiting: Callable[[], None] | None = None, *, picked: tuple[str, int] | None = None,
              failed: tuple[str, RemotingError] | None = None) -> SendResult:
        """Send a request (SEND_MESSAGE_V2, or SEND_BATCH_MESSAGE when `batch`) with retries on other queues.
        `picked`: the first attempt goes to this (address, queue); `failed`: the first attempt was made
        (`send`'s plain path) at that address and failed with that error, so this goes on with the second."""
        timeout = (timeout_ms / 1000.0) if timeout_ms is not None else self._base.timeout
        work = [while_waiting] if while_waiting is not None else []  # run once, by the first request written
        if work:  # (the closure only when there is something to run: a plain send makes none)

            def run_once() -> None:
                if work:
                    work.pop()()

        avoid = None
        last: Exception | None = None
        start = 0
        if failed is not None:
            (avoid, last), start = failed, 1
        ok = _OK_CODES
        if stream is not None:
            validate_stream_id(stream)
            if expected_version is not None and expected_version < 0:
                raise ValueError(f"expected_version must be >= 0 or None, not {expected_version}")
            ok = _STREAM_OK_CODES
            if queue_id is None:
                queue_id = self._stream_queue(topic, stream)
        # the header's values as the strings RemotingCommand.request would make of them (same bytes), built
        # here so that the request needs no conversion pass; anything but plain ints goes through request()
        text = INT_TEXT.get  # str() of the small ints, made once
        plain = (flag.__class__ is int and sys_flag.__class__ is int and reconsume.__class__ is int
                 and (expected_version is None or expected_version.__class__ is int))
        if plain:
            sys_flag_s, flag_s, reconsume_s = (text(sys_flag) or str(sys_flag), text(flag) or str(flag),
                                               text(reconsume) or str(reconsume))
        # the timeout is the whole call's, as in RocketMQ's sendDefaultImpl: a retry gets what is left of it, and
        # none is made once it is spent. A request that timed out may have been stored: sending it again could
        # store the message twice (a Celery task run twice), so a timeout is raised, never retried
        deadline = _monotonic() + timeout
        for attempt in range(start, 1 + self.retry_times_when_send_failed):
            left = deadline - _monotonic()
            if last is not None and (left <= 0 or isinstance(last, RemotingTimeoutError)):
                break
            addr, q = picked if picked is not None and attempt == 0 else self._pick(topic, queue_id, avoid)
            fast = plain and q.__class__ is int
            if fast:
                ext = {"a": self.group, "b": topic, "c": AUTO_CREATE_TOPIC_KEY_TOPIC, "d": "4", "e": text(q) or str(q),
                       "f": sys_flag_s, "g": str(int(time.time() * 1000)), "h": flag_s, "i": props,
                       "j": reconsume_s, "k": "false"}
            else:
                ext = {"a": self.group, "b": topic, "c": AUTO_CREATE_TOPIC_KEY_TOPIC, "d": 4, "e": q, "f": sys_flag,
                       "g": int(time.time() * 1000), "h": flag, "i": props, "j": reconsume, "k": False}
            if batch:
                ext["m"] = "true" if fast else True
            if stream is not None:
                try:
                    served = self.supports(addr, "expectedVersionAppend")
                except RemotingError as e:
                    last, avoid = e, addr
                    continue
                if not served:
                    raise ExtensionNotSupportedError(
                        f"the broker at {addr} does not serve expected-version appends (an Apache RocketMQ "
                        f"broker?): nothing was sent. Run the rmq_eventstore broker, or check versions in your "
                        f"own database inside a transaction (TransactionProducer) instead of stream=...")
                ext["streamId"] = stream
                if expected_version is not None:
                    ext["expectedVersion"] = str(expected_version) if fast else expected_version
            if fast:  # every value a str already: what request() would build, without its conversion pass
                cmd = RemotingCommand(code if not batch else RequestCode.SEND_BATCH_MESSAGE, ext, body, next_opaque())
            else:
                cmd = RemotingCommand.request(code if not batch else RequestCode.SEND_BATCH_MESSAGE, ext, body)
            try:
                r = self._base.invoke(addr, cmd, max(left, 0.001), ok=ok, while_waiting=run_once if work else None)
            except RemotingError as e:
                last = e
                avoid = addr
                if (attempt < self.retry_times_when_send_failed and stream is None
                        and not isinstance(e, RemotingTimeoutError)):
                    self._base.route(topic, refresh=True)
                if stream is not None:
                    break  # an append may have been stored: a blind retry could add the events twice
                continue
            return self._result(r, q, msg_id, topic, addr, stream, expected_version)
        assert last is not None
        raise last

    @staticmethod
    def _result(r: RemotingCommand, q: int, msg_id: str, topic: str, addr: str, stream: str | None,
                expected_version: int | None) -> SendResult:
        """The SendResult of a send's response `r` (its code one of the ok codes) from queue `q` at `addr`."""
        x = r.ext_fields
        if r.code == ResponseCode.STREAM_VERSION_CONFLICT:
            current = x.get("currentVersion")
            raise ConcurrencyError(r.remark or "stream version conflict", stream or "", expected_version,
                                   int(current) if current is not None else None)
        version = x.get("streamVersion")
        qid = x.get("queueId")
        queue = TEXT_INT.get(qid) if qid is not None else None  # int() of a small one's text, from a table
        return SendResult(_SEND_STATUS[r.code], msg_id, x.get("msgId", ""),
                          queue if queue is not None else int(q if qid is None else qid),
                          int(x.get("queueOffset", -1)), topic, addr,
                          int(version) if version is not None else None)


class _ProducerBase(ClientBase):
    def __init__(self, namesrv_addr: str, producer: Producer, timeout: float, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        super().__init__(namesrv_addr, timeout, access_key, secret_key)
        self.producer = producer

    def heartbeat_data(self) -> dict:
        return {"clientID": self.client_id, "producerDataSet": [{"groupName": self.producer.group}],
                "consumerDataSet": []}

    def _unregister(self) -> None:
        for addr in self._known_brokers():
            try:
                self.remoting.invoke(addr, RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, {
                    "clientID": self.client_id, "producerGroup": self.producer.group}), 1.0)
            except RemotingError:
                pass
