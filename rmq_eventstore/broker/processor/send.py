"""Sends (`SendMessageProcessor`): SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE and
CONSUMER_SEND_MSG_BACK.

`put` is the one place where a message a producer sent is checked, routed and stored (topic rules and
auto-creation, queue choice, retry topics over their limit to the DLQ, UNIQ_KEY and CLUSTER properties,
delay levels, half messages of transactions); the features that decide when and whether a write happens
hook in here.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...common import Message, PutMessageStatus, codec
from ...common.properties import (
    PROPERTY_BATCH_QUEUE_ID,
    PROPERTY_CLUSTER,
    PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_RETRY_TOPIC,
    PROPERTY_STREAM_ID,
    PROPERTY_STREAM_TX_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX,
    get_property,
    set_property,
)
from ...common.rng import rng
from ...common.small_ints import INT_TEXT, TEXT_INT
from ...common.stream import StreamIdError, validate_stream_id
from ...common.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    RMQ_SYS_TRANS_HALF_TOPIC,
    TopicValidationError,
    is_not_allowed_send_topic,
    is_system_topic,
    validate_topic,
)
from ...common.topic_config import PermName
from ...remoting import FLAG_RESPONSE, HeaderError, RemotingCommand, RequestCode, ResponseCode
from ...store.timer import TimerMessageError, transform_timer_message
from ..config import DLQ_NUMS_PER_GROUP
from ..schedule import transform_delay_level_message
from ..transaction.service import TransactionalMessageService

if TYPE_CHECKING:
    from ..broker import Broker

PROPERTY_UNIQ_KEY = PROPERTY_UNIQ_CLIENT_MESSAGE_ID_KEYIDX
_TRAN_MARKER = f"{PROPERTY_TRANSACTION_PREPARED}{codec.NAME_VALUE_SEPARATOR}"

_PUT_OK = PutMessageStatus.PUT_OK
_join_ids = codec.join_message_ids
# SendMessageProcessor.lane in C (`_native.send_lane`): with the native core, its remoting codec (the frame and
# command slots) and the batch block's Message check (it fills every Message slot, as decode_batch_messages)
NATIVE_LANE = (codec.native.send_lane if codec.batch_native is not None and hasattr(codec.native, "send_lane")
               else None)
# ... and for a read that is exactly one SEND_MESSAGE_V2 frame, from its bytes (the server's data_received)
NATIVE_FRAME_LANE = codec.native.send_frame if NATIVE_LANE is not None else None
_SEND_V2 = RequestCode.SEND_MESSAGE_V2
_SUCCESS = int(ResponseCode.SUCCESS)
_TRANSACTION_BITS = codec.TRANSACTION_ROLLBACK_TYPE  # both transaction bits of sysFlag (0xC)
# header keys of a SEND_MESSAGE_V2 that the lane leaves to the full path: streams and conditional appends,
# and the V1 names of fields the full path falls back to when a short name is missing
_LANE_EXTENSIONS = ("streamId", "expectedVersion", "streams", "batch", "properties", "maxReconsumeTimes",
                    "defaultTopicQueueNums")
PUT_STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_BUSY,
}


def _header_str(x: dict[str, str], short: str, long: str) -> str | None:
    """A send header field by its V2 short name, else by its V1 name."""
    v = x.get(short)
    return x.get(long) if v is None else v


def _header_int(x: dict[str, str], short: str, long: str, default: Any) -> Any:
    """An integer header field by its V2 short name or its V1 name (`default` when absent or empty)."""
    v = x.get(short)
    if v is None:
        v = x.get(long)
    if not v:
        return default
    try:
        return int(v)
    except ValueError:
        raise HeaderError(f"the custom field <{long}> is not an integer: {v[:64]!r}") from None


class SendMessageProcessor:
    """Producers' sends and consumers' send-backs."""

    # the lane's route stamp and routes are slots: the C send lane (`sl_serve`) reads them at their offsets
    __slots__ = ("_lane_counter", "_lane_timestamp", "_lane_routes", "__dict__", "__weakref__")

    CODES = (RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE,
             RequestCode.CONSUMER_SEND_MSG_BACK)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.topics = broker.topic_manager
        self._uniq_ids = codec.UniqueIdGenerator()  # UNIQ_KEY for messages a producer sent without one
        self._topics_version = broker.topic_manager.file.data_version  # changed in place by every change
        self._lane_counter, self._lane_timestamp = -1, -1  # the version the lane's routes were made for
        self._lane_routes: dict[str, tuple[int, int]] = {}  # topic -> queue counts, for topics `lane` may serve
        self._uniq_marker = PROPERTY_UNIQ_KEY + codec.NAME_VALUE_SEPARATOR
        self._cluster_marker = PROPERTY_CLUSTER + codec.NAME_VALUE_SEPARATOR
        self._cluster = f"{self._cluster_marker}{broker.config.broker_cluster_name}{codec.PROPERTY_SEPARATOR}"

    def lane(self, req: RemotingCommand, channel: Any) -> RemotingCommand | None:
        """The response to a plain SEND_MESSAGE_V2, served by a short path; None when the request needs the
        full one (`process`): a batch, a stream append, a transaction, a delayed or timer message, a retry,
        DLQ or system topic, a topic not yet known writeable, a header field missing or not an integer.

        Checks, decoration and stored bytes are those of `process` (UNIQ_KEY and CLUSTER added the same
        way, the same queue choice, the same response fields), without its generality: one message, the
        topic's checks done once per topic and kept until topics.json changes. The server serves the
        broker's ordinary sends with it."""
        x = req.ext_fields
        topic = x.get("b")
        dv = self._topics_version
        if dv.counter != self._lane_counter or dv.timestamp != self._lane_timestamp:
            # topics.json changed: every route is made again
            self._lane_counter, self._lane_timestamp, self._lane_routes = dv.counter, dv.timestamp, {}
        route = self._lane_routes.get(topic)  # type: ignore[arg-type]
        if route is None:
            route = self._lane_route(topic)
            if route is None:
                return None
        props = x.get("i") or ""
        if ("m" in x and x["m"].strip().lower() == "true") or "DELAY" in props or "TIMER_" in props \
                or _TRAN_MARKER in props:
            return None
        for key in _LANE_EXTENSIONS:
            if key in x:
                return None
        try:
            # the small ones (queue id, flags, "4" queues: nearly always) read from a table, int() for the rest
            small = TEXT_INT.get
            e, f, h, j = x["e"], x["f"], x["h"], x["j"]
            queue_id, sys_flag, flag, reconsume = small(e), small(f), small(h), small(j)
            if queue_id is None:
                queue_id = int(e)
            if sys_flag is None:
                sys_flag = int(f)
            if flag is None:
                flag = int(h)
            if reconsume is None:
                reconsume = int(j)
            born_ts = int(x["g"])
            max_reconsume, queue_nums = x.get("l"), x.get("d")  # unused here, but refused by the full path when bad
            if max_reconsume and small(max_reconsume) is None:
                int(max_reconsume)
            if queue_nums and small(queue_nums) is None:
                int(queue_nums)
        except (KeyError, ValueError):
            return None
        if sys_flag & _TRANSACTION_BITS:
            return None
        if queue_id < 0:
            queue_id = rng.randrange(route[0])
        elif queue_id >= route[1]:
            return None  # refused, with its message, by the full path
        store = self.broker.store
        props = self._decorated(props, store.config.auto_create_uniq_key)
        res = store.put_message(Message(topic, req.body, None, None, queue_id, flag, None, sys_flag, born_ts,
                                        getattr(channel, "remote_address", None) or None, reconsume, 0, props))
        return self.lane_answer(req, res, queue_id)

    def lane_answer(self, req: RemotingCommand, res: Any, queue_id: int,
                    transaction_id: str | None = None) -> RemotingCommand:
        """The lane's response to a put's result (`res`, a PutMessageResult): the refusal with its status, or
        SUCCESS with the offsetMsgId, queue id and queue offset (and, for a half message the C lane stored,
        its `transaction_id`, as `_store` answers it). Also what answers the (request, result, queue id[,
        transaction id]) the C lane hands back for a result it does not answer itself."""
        a = res.append_result
        if res.status is not _PUT_OK or a is None:
            code = PUT_STATUS_CODES.get(res.status, ResponseCode.SYSTEM_ERROR)
            return req.response(code, f"{res.status.name}: {res.reason}" if res.reason else res.status.name)
        ext = {"msgId": _join_ids(a.store_host, a.store_port, a.offsets) if a.offsets else a.msg_id,
               "queueId": INT_TEXT.get(queue_id) or str(queue_id), "queueOffset": str(a.logics_offset),
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if transaction_id is not None:
            ext["transactionId"] = transaction_id
        return RemotingCommand(_SUCCESS, ext, b"", req.opaque, FLAG_RESPONSE, None, "JAVA", req.version)

    def lane_context(self) -> tuple[Any, ...]:
        """The fixed arguments of the C lane (`_native.send_lane(req, born_host, ctx)`): this processor (its
        routes and their version stamp are read by name), the topics' data version, the store, the UNIQ_KEY
        generator, the UNIQ_KEY and CLUSTER markers, the CLUSTER property text `_decorated` appends, the
        store's config (its `auto_create_uniq_key` is read at each send) and the half lane's context: (the
        broker's config, whose `reject_transaction_message` is read at each half message, the half topic), or
        None when half messages are left to `process` (a transaction service whose `prepare` is not the one
        the C lane does, or a CLUSTER text naming REAL_TOPIC / REAL_QID)."""
        store = self.broker.store
        half = None
        service = getattr(self.broker, "transaction_service", None)
        if (service is not None and type(service).prepare is TransactionalMessageService.prepare
                and PROPERTY_REAL_TOPIC not in self._cluster and PROPERTY_REAL_QUEUE_ID not in self._cluster):
            half = (self.broker.config, RMQ_SYS_TRANS_HALF_TOPIC)
        return (self, self._topics_version, store, self._uniq_ids, self._uniq_marker, self._cluster_marker,
                self._cluster, store.config, half)

    def serve_lane(self, req: RemotingCommand, channel: Any) -> RemotingCommand | bytes | None:
        """A plain SEND_MESSAGE_V2 answered by the C lane when it serves it (the response frame, bytes), else by
        `lane` (a RemotingCommand, or None: the full path's). What `BrokerServer.handle` does inline."""
        if NATIVE_LANE is not None:
            got = NATIVE_LANE(req, getattr(channel, "remote_address", None) or "", self.lane_context())
            if got is not None:
                return got if got.__class__ is bytes else self.lane_answer(*got)
        return self.lane(req, channel)

    def _decorated(self, props: str, auto_uniq: bool) -> str:
        """The properties a sent message is stored with: a UNIQ_KEY when it has none (and `auto_uniq`), the
        broker's CLUSTER when it has none; absent properties are appended (what set_property does when there
        is nothing to remove)."""
        sep = codec.PROPERTY_SEPARATOR
        if auto_uniq and self._uniq_marker not in props:
            if props and not props.endswith(sep):
                props += sep
            props += f"{self._uniq_marker}{self._uniq_ids.create()}{sep}"
        if self._cluster_marker not in props:
            if props and not props.endswith(sep):
                props += sep
            props += self._cluster
        return props

    def _lane_route(self, topic: str | None) -> tuple[int, int] | None:
        """For a topic the lane may serve, the count of queues a send without one picks from and the count
        a queue id must be below (what `put` reads from the topic config), remembered until topics.json
        changes; None for any other topic."""
        if topic is None or topic.startswith(("%", "rmq_sys_")) or is_system_topic(topic) \
                or is_not_allowed_send_topic(topic):
            return None
        try:
            validate_topic(topic)
        except (TopicValidationError, TypeError):
            return None
        tc = self.topics.get(topic)
        if tc is None or not PermName.is_writeable(tc.perm):
            return None  # auto-creation and the refusals are the full path's
        route = (max(tc.write_queue_nums, 1), max(tc.write_queue_nums, tc.read_queue_nums))
        if len(self._lane_routes) < 10_000:
            self._lane_routes[topic] = route
        return route

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        if req.code == RequestCode.CONSUMER_SEND_MSG_BACK:
            return self._consumer_send_msg_back(req, channel)
        return self._send_message(req, channel)

    def _send_message(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        # 310 and 320 carry SendMessageRequestHeaderV2's short names, 10 the long ones; a field is read by
        # its short name first, then its long one (what mapping the header to V1 did, without the copy).
        x = req.ext_fields
        get_int = _header_int
        topic = _header_str(x, "b", "topic")
        if topic is None:
            raise HeaderError("the custom field <topic> is null")
        batch = req.code == RequestCode.SEND_BATCH_MESSAGE or (
            _header_str(x, "m", "batch") or "").strip().lower() == "true"  # Boolean.parseBoolean
        try:  # what every V2 header holds (read as _header_int reads them); else field by field below
            queue_id, sys_flag, born_ts, flag, reconsume = int(x["e"]), int(x["f"]), int(x["g"]), int(x["h"]), int(x["j"])
        except (KeyError, ValueError):
            queue_id = get_int(x, "e", "queueId", -1)
            sys_flag = get_int(x, "f", "sysFlag", 0)
            born_ts = get_int(x, "g", "bornTimestamp", 0)
            flag = get_int(x, "h", "flag", 0)
            reconsume = get_int(x, "j", "reconsumeTimes", 0)
        props = _header_str(x, "i", "properties") or ""
        max_reconsume = get_int(x, "l", "maxReconsumeTimes", None)
        default_nums = get_int(x, "d", "defaultTopicQueueNums", self.broker.config.default_topic_queue_nums)
        born_host = getattr(channel, "remote_address", None) or None
        if batch:
            try:  # one Message per inner message (in C when the native core is active)
                msgs = codec.decode_batch_messages(req.body, topic, queue_id, sys_flag, born_ts, born_host,
                                                   reconsume)
            except ValueError as e:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {e}")
            if not msgs:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
        else:
            msgs = [Message(topic=topic, body=req.body, queue_id=queue_id, flag=flag, properties_string=props,
                            sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
                            reconsume_times=reconsume)]
        stream = x.get("streamId") or None
        expected = get_int(x, "expectedVersion", "expectedVersion", -1)
        streams_text = x.get("streams")
        if streams_text is not None:
            if not batch or stream is not None:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, "a multi-stream append (streams) is a batch "
                                    "without streamId")
            try:
                streams = json.loads(streams_text)
                if not isinstance(streams, dict) or not all(
                        isinstance(k, str) and (v is None or (isinstance(v, int) and not isinstance(v, bool)
                                                              and v >= 0)) for k, v in streams.items()):
                    raise ValueError("not an object of stream id to expected version (an int >= 0 or null)")
            except ValueError as e:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, f"bad streams header: {e}")
            code, remark, ext = self.put_streams(msgs, streams, default_topic_queue_nums=default_nums)
            return req.response(code, remark, ext)
        code, remark, ext = self.put(msgs, max_reconsume_times=max_reconsume, default_topic_queue_nums=default_nums,
                                     batch=batch, stream=stream, expected_version=expected if expected >= 0 else None)
        return req.response(code, remark, ext)

    def put(self, msgs: list[Message], *, max_reconsume_times: int | None = None,
            default_topic_queue_nums: int | None = None, batch: bool = False, stream: str | None = None,
            expected_version: int | None = None,
            streams: dict[str, int | None] | None = None) -> tuple[int, str | None, dict[str, Any] | None]:
        """Check, route and store messages of one topic and queue (`SendMessageProcessor`; `streams`: see
        `put_streams`).

        With `stream`, the messages are the next events of that stream (numbered from its current version
        + 1) and `expected_version`, when not None, must be the stream's current version, else nothing is
        stored and the answer is STREAM_VERSION_CONFLICT with the current version.
        Returns (response code, remark, response extFields: msgId, queueId, queueOffset[, streamVersion]).
        """
        first = msgs[0]
        topic = first.topic
        try:
            validate_topic(topic)
        except (TopicValidationError, TypeError) as e:
            return ResponseCode.SYSTEM_ERROR, str(e), None
        if is_not_allowed_send_topic(topic):
            return ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.", None
        tx = codec.transaction_value(first.sys_flag)
        first_props = first.properties_string or ""
        prepared = tx == codec.TRANSACTION_PREPARED_TYPE or (
            _TRAN_MARKER in first_props
            and (get_property(first_props, PROPERTY_TRANSACTION_PREPARED) or "").lower() == "true")
        if prepared:
            if self.broker.config.reject_transaction_message:
                return (ResponseCode.NO_PERMISSION,
                        f"the broker[{self.broker.config.broker_name}] sending transaction message is forbidden", None)
            if batch:
                return ResponseCode.MESSAGE_ILLEGAL, "transactional messages cannot be sent as a batch", None
        elif tx == codec.TRANSACTION_ROLLBACK_TYPE:
            return ResponseCode.MESSAGE_ILLEGAL, "a message cannot be sent with the ROLLBACK transaction type", None
        tc = self.topics.get(topic)
        if tc is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = self.topics.create_retry_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
            elif self.broker.config.auto_create_topic_enable:
                # min(client's defaultTopicQueueNums, the broker's), as createTopicInSendMessageMethod
                n = self.broker.config.default_topic_queue_nums
                if default_topic_queue_nums is not None and default_topic_queue_nums > 0:
                    n = min(n, default_topic_queue_nums)
                tc = self.topics.ensure(topic, n)
            if tc is None:
                return ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!", None
        if not PermName.is_writeable(tc.perm):
            return ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden", None
        if streams is not None:
            return self._put_streams(msgs, streams, tc)
        queue_id = first.queue_id
        if queue_id < 0:
            queue_id = rng.randrange(max(tc.write_queue_nums, 1))
        elif queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            return (ResponseCode.SYSTEM_ERROR,
                    f"request queueId[{queue_id}] is illegal, topic: {topic} writeQueueNums: "
                    f"{tc.write_queue_nums} readQueueNums: {tc.read_queue_nums}", None)
        # Retry topic over its limit → the group's DLQ (handleRetryAndDLQ).
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not batch:
            group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            sg = self.broker.group_manager.find(group)
            limit = max_reconsume_times if max_reconsume_times is not None else (sg.retry_max_times if sg else 16)
            if first.reconsume_times >= limit:
                dlq = DLQ_GROUP_TOPIC_PREFIX + group
                self.topics.ensure(dlq, DLQ_NUMS_PER_GROUP)
                topic, queue_id = dlq, 0
        if stream is None:
            return self._store(msgs, topic, queue_id, batch, prepared)
        try:
            validate_stream_id(stream)
        except StreamIdError as e:
            return ResponseCode.MESSAGE_ILLEGAL, str(e), None
        if topic != first.topic or is_system_topic(topic) or topic.startswith((RETRY_GROUP_TOPIC_PREFIX,
                                                                                DLQ_GROUP_TOPIC_PREFIX)):
            return ResponseCode.MESSAGE_ILLEGAL, f"topic {first.topic} takes no stream appends", None
        if any("DELAY" in (m.properties_string or "") or "TIMER_" in (m.properties_string or "") for m in msgs):
            return ResponseCode.MESSAGE_ILLEGAL, "a stream append cannot be delayed", None
        versions = self.broker.stream_versions
        with versions.lock_for(topic, stream):
            group = get_property(first.properties_string or "", PROPERTY_STREAM_TX_GROUP) if prepared else None
            first_version, conflict = versions.check(topic, stream, expected_version, len(msgs), group)
            if conflict is not None:
                ext = {"streamId": stream, "currentVersion": conflict.current}
                if expected_version is not None:
                    ext["expectedVersion"] = expected_version
                return ResponseCode.STREAM_VERSION_CONFLICT, conflict.message(), ext
            versions.stamp(msgs, stream, first_version)
            last = first_version + len(msgs) - 1
            code, remark, ext = self._store(msgs, topic, queue_id, batch, prepared)
            if ext is not None:
                if prepared:
                    versions.reserve(topic, stream, ext.get("transactionId", ""), last, group)
                else:
                    versions.appended(topic, stream, last)
                ext["streamVersion"] = last
            return code, remark, ext

    def put_streams(self, msgs: list[Message], streams: dict[str, int | None], *,
                    default_topic_queue_nums: int | None = None) -> tuple[int, str | None, dict[str, Any] | None]:
        """Append a batch whose messages belong to several streams of one topic, all or nothing (our
        extension, `multiStreamAppend`). Each message names its stream in its `STREAM_ID` property; `streams`
        maps every stream of the batch to its expected version (None: no check). The streams' locks are
        taken in stripe order, every expected version is checked, the messages are numbered per stream in
        batch order and stored as one `put_messages`. A message may go to another queue of the topic than
        the batch's (`BATCH_QUEUE_ID`); queue offsets stay consecutive per queue. A conflict stores nothing
        and answers STREAM_VERSION_CONFLICT naming the first stream (in batch order) that conflicted."""
        return self.put(msgs, default_topic_queue_nums=default_topic_queue_nums, batch=True, streams=streams)

    def _put_streams(self, msgs: list[Message], streams: dict[str, int | None],
                     tc: Any) -> tuple[int, str | None, dict[str, Any] | None]:
        topic = msgs[0].topic
        if is_system_topic(topic) or topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
            return ResponseCode.MESSAGE_ILLEGAL, f"topic {topic} takes no stream appends", None
        nqueues = max(tc.write_queue_nums, tc.read_queue_nums)
        order: list[str] = []
        counts: dict[str, int] = {}
        queue_ids: list[int] = []
        default_queue = msgs[0].queue_id
        for i, m in enumerate(msgs):
            props = m.properties_string or ""
            stream = get_property(props, PROPERTY_STREAM_ID)
            if not stream or stream not in streams:
                return (ResponseCode.MESSAGE_ILLEGAL,
                        f"message {i} of the batch names no stream of the streams header ({stream!r})", None)
            if "DELAY" in props or "TIMER_" in props:
                return ResponseCode.MESSAGE_ILLEGAL, "a stream append cannot be delayed", None
            q = default_queue
            own = get_property(props, PROPERTY_BATCH_QUEUE_ID)
            if own is not None:
                if not own.isdigit():
                    return ResponseCode.MESSAGE_ILLEGAL, f"message {i} of the batch: bad queue id {own!r}", None
                q = int(own)
                m.properties_string = codec.delete_property(props, PROPERTY_BATCH_QUEUE_ID)
            if q < 0 or q >= nqueues:
                return (ResponseCode.SYSTEM_ERROR, f"request queueId[{q}] is illegal, topic: {topic} "
                        f"writeQueueNums: {tc.write_queue_nums} readQueueNums: {tc.read_queue_nums}", None)
            queue_ids.append(q)
            if stream not in counts:
                order.append(stream)
                counts[stream] = 0
            counts[stream] += 1
        if set(order) != set(streams):
            return ResponseCode.MESSAGE_ILLEGAL, "the streams header names a stream with no message", None
        for stream in order:
            try:
                validate_stream_id(stream)
            except StreamIdError as e:
                return ResponseCode.MESSAGE_ILLEGAL, str(e), None
        versions = self.broker.stream_versions
        locks = versions.locks_for(topic, order)
        for lock in locks:
            lock.acquire()
        try:
            firsts: dict[str, int] = {}
            for stream in order:
                first_version, conflict = versions.check(topic, stream, streams[stream], counts[stream])
                if conflict is not None:
                    ext: dict[str, Any] = {"streamId": stream, "currentVersion": conflict.current}
                    if streams[stream] is not None:
                        ext["expectedVersion"] = streams[stream]
                    return ResponseCode.STREAM_VERSION_CONFLICT, conflict.message(), ext
                firsts[stream] = first_version
            per_stream: dict[str, list[Message]] = {s: [] for s in order}
            for m in msgs:
                per_stream[get_property(m.properties_string or "", PROPERTY_STREAM_ID) or ""].append(m)
            for stream, ms in per_stream.items():
                versions.stamp(ms, stream, firsts[stream])
            code, remark, ext2 = self._store(msgs, topic, queue_ids[0], True, False, queue_ids)
            if ext2 is not None:
                last = {s: firsts[s] + counts[s] - 1 for s in order}
                for s, v in last.items():
                    versions.appended(topic, s, v)
                ext2["streamVersions"] = json.dumps(last, separators=(",", ":"))
            return code, remark, ext2
        finally:
            for lock in reversed(locks):
                lock.release()

    def _store(self, msgs: list[Message], topic: str, queue_id: int, batch: bool,
               prepared: bool, queue_ids: list[int] | None = None) -> tuple[int, str | None, dict[str, Any] | None]:
        """Decorate (UNIQ_KEY, CLUSTER, half message or delay level) and store routed messages (each to
        `queue_ids[i]` when given, else all to `queue_id`)."""
        store = self.broker.store
        max_level = self.broker.schedule_service.max_level
        delayed = False
        auto_uniq = store.config.auto_create_uniq_key
        # a plain batch's loop in C when nothing in it needs the Python one (codec.decorate_batch)
        done = (batch and not prepared and queue_ids is None
                and codec.decorate_batch(msgs, topic, queue_id, self._uniq_marker if auto_uniq else None,
                                         self._cluster_marker, self._cluster))
        for i, m in enumerate(() if done else msgs):
            m.topic = topic
            m.queue_id = queue_id if queue_ids is None else queue_ids[i]
            m.properties_string = props = self._decorated(m.properties_string or "", auto_uniq)
            if prepared:
                self.broker.transaction_service.prepare(m)  # stored on the half topic until its end
            elif "TIMER_" in props and self.broker.timer_store is not None:
                if batch:
                    return ResponseCode.MESSAGE_ILLEGAL, "a batch may not hold timer messages", None
                cfg = store.config
                try:
                    transform_timer_message(m, cfg.timer_precision_ms, cfg.timer_max_delay_sec, store.now())
                except TimerMessageError as e:
                    return ResponseCode.MESSAGE_ILLEGAL, str(e), None
            elif "DELAY" in props:
                if batch:
                    if transform_delay_level_message(Message(topic, properties_string=props), max_level):
                        return ResponseCode.MESSAGE_ILLEGAL, "a batch may not hold delayed messages", None
                elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                    m.properties_string = codec.delete_property(props, "DELAY")
                elif transform_delay_level_message(m, max_level):
                    delayed = True
        res = store.put_messages(msgs) if batch else store.put_message(msgs[0])
        if delayed:
            self.broker.schedule_service.wakeup()
        status = res.status  # PUT_OK by identity first: an Enum member's hash is a Python call
        code = ResponseCode.SUCCESS if status is _PUT_OK else PUT_STATUS_CODES.get(status, ResponseCode.SYSTEM_ERROR)
        a = res.append_result
        if a is None or not res.is_ok():
            return code, f"{res.status.name}: {res.reason}" if res.reason else res.status.name, None
        # the offsetMsgId(s), comma-joined (in C when active; a.msg_id's text, without its property and list)
        msg_id = codec.join_message_ids(a.store_host, a.store_port, a.offsets) if a.offsets else a.msg_id
        ext = {"msgId": msg_id, "queueId": queue_id, "queueOffset": a.logics_offset,
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        if prepared:
            ext["transactionId"] = get_property(msgs[0].properties_string or "", PROPERTY_UNIQ_KEY) or a.msg_id
        return code, None, ext

    def put_message(self, msg: Message) -> tuple[int, str | None, dict[str, Any] | None]:
        """In-process send of one message through the broker's checks (delay levels, retry, DLQ)."""
        if msg.properties_string is None:
            msg.properties_string = codec.build_properties_string(msg, msg.uniq_key)
        return self.put([msg])

    def _consumer_send_msg_back(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        code, remark = self.send_back(req.get_str("group"), req.get_int("offset"), req.get_int("delayLevel", 0),
                                      req.get_str("originMsgId", None), req.get_str("originTopic", None),
                                      req.get_int("maxReconsumeTimes", None))
        return req.response(code, remark)

    def send_back(self, group: str, commit_log_offset: int, delay_level: int = 0, origin_msg_id: str | None = None,
                  origin_topic: str | None = None, max_reconsume_times: int | None = None) -> tuple[int, str | None]:
        """`consumerSendMsgBack`: a message the group failed to consume goes to `%RETRY%<group>` with a
        delay level (3 + reconsume times by default), or to `%DLQ%<group>` once it was reconsumed
        `max_reconsume_times` times (or the level is negative)."""
        sg = self.broker.group_manager.find(group)
        if sg is None:
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
        if sg.retry_queue_nums <= 0:
            return ResponseCode.SUCCESS, None
        msg = self.broker.store.look_message_by_offset(commit_log_offset) if commit_log_offset >= 0 else None
        if msg is None:
            return ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {commit_log_offset}"
        props = msg.properties_string
        if get_property(props, PROPERTY_RETRY_TOPIC) is None:
            props = set_property(props, PROPERTY_RETRY_TOPIC, msg.topic)
        limit = max_reconsume_times if max_reconsume_times is not None else sg.retry_max_times
        reconsume = msg.reconsume_times
        if reconsume >= limit or delay_level < 0:
            topic = DLQ_GROUP_TOPIC_PREFIX + group
            self.topics.ensure(topic, DLQ_NUMS_PER_GROUP)
            queue_id = 0
            props = codec.delete_property(props, "DELAY")
        else:
            topic = RETRY_GROUP_TOPIC_PREFIX + group
            tc = self.topics.create_retry_topic(group)
            queue_id = rng.randrange(max(tc.write_queue_nums if tc else 1, 1))
            props = set_property(props, "DELAY", str(delay_level if delay_level > 0 else 3 + reconsume))
        origin = get_property(props, PROPERTY_ORIGIN_MESSAGE_ID)
        if not origin:
            props = set_property(props, PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or msg.msg_id)
        new = Message(topic=topic, body=bytes(msg.body), queue_id=queue_id, flag=msg.flag, properties_string=props,
                      sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                      reconsume_times=reconsume + 1)
        delayed = transform_delay_level_message(new, self.broker.schedule_service.max_level)
        res = self.broker.store.put_message(new)
        if delayed:
            self.broker.schedule_service.wakeup()
        if res.is_ok():
            return ResponseCode.SUCCESS, None
        return ResponseCode.SYSTEM_ERROR, f"{res.status.name}: {res.reason}"
