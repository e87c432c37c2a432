"""`Broker`: what consumers and producers need on top of a `MessageStore`, as RocketMQ's broker does it.

A plain object (usable in-process, no sockets): topic configs (topics.json, auto-created on first send
when `auto_create_topic_enable`), subscription groups (subscriptionGroup.json), consumer offsets
(consumerOffset.json, persisted every 5 s and at shutdown), client registrations from heartbeats,
long polling (`PullRequestHoldService`, woken by the store's message-arriving listener), delay levels
(`ScheduleMessageService`), retry (`%RETRY%<group>`) and dead-letter (`%DLQ%<group>`) topics.

`process(request, channel)` serves one remoting request the way RocketMQ's processors do
(`SendMessageProcessor`, `PullMessageProcessor`, `ConsumerManageProcessor`, `ClientManageProcessor`,
`QueryMessageProcessor`, `AdminBrokerProcessor`) and `process_namesrv` the name server's part
(`DefaultRequestProcessor`: routes, topic list, cluster info) for a broker that is its own name server.
`process` returns either the response or, for a pull that found nothing and may be held, a `PullHold`
that the server awaits (`wait_for_arrival`) before calling `process_pull(..., allow_suspend=False)`.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..remoting import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    HeaderError,
    RemotingCommand,
    RequestCode,
    ResponseCode,
    send_header_v1,
)
from ..store import GetMessageStatus, Message, MessageFilter, MessageStore, PutMessageStatus, codec
from ..store.config_files import (
    ConfigFileError,
    PermName,
    SubscriptionGroupConfig,
    TopicConfig,
    fastjson_loads,
)
from ..store.topic import (
    AUTO_CREATE_TOPIC_KEY_TOPIC,
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicValidationError,
    is_not_allowed_send_topic,
    is_system_topic,
    is_valid_group,
    validate_topic,
)
from .schedule import ScheduleMessageService, get_property, set_property, transform_delay_level_message

log = logging.getLogger(__name__)

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_CLUSTER = "CLUSTER"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
DLQ_NUMS_PER_GROUP = 1
MASTER_ID = 0
MAX_GROUPS_PER_HEARTBEAT = 256  # each new group is a config-file write; a real client names a handful


@dataclass
class BrokerConfig:
    """Broker settings (`BrokerConfig` names in snake_case, RocketMQ's defaults)."""

    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = MASTER_ID
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 4
    auto_create_subscription_group: bool = True
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1000
    max_suspend_timeout_mills: int = 5 * 60 * 1000  # a hostile suspend timeout cannot hold a pull for days
    flush_consumer_offset_interval: int = 5000
    channel_expired_timeout: int = 120_000
    default_query_max_num: int = 32
    max_pull_msg_nums: int = 1024
    message_delay_level: str | None = None  # None: the store's message_delay_level

    @classmethod
    def field_names(cls) -> set[str]:
        return set(cls.__dataclass_fields__)


class Channel(Protocol):
    """A client connection as the broker sees it (the server's connection object implements it)."""

    remote_address: str

    def send_oneway(self, command: RemotingCommand) -> None:
        """Send a request to the client without waiting for an answer (thread-safe)."""


@dataclass
class PullHold:
    """A pull that found nothing and asked to be suspended: wait for an arrival or the timeout, then
    call `Broker.process_pull(request, channel, allow_suspend=False)`."""

    request: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    timeout_ms: int


@dataclass
class ClientInfo:
    """One registered client of a group (`ClientChannelInfo` + its subscriptions)."""

    client_id: str
    channel: Any
    language: str
    version: int
    last_update: float
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> subString
    consume_type: str = ""
    message_model: str = ""


class PullRequestHoldService:
    """Held pulls by (topic, queue id); `notify_message_arriving` (reput thread) wakes those behind the
    new max offset. Waking calls the hold's `wake` callback exactly once; it must not block."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, int], dict[int, tuple[int, Callable[[], None]]]] = {}
        self._next = 0

    def hold(self, topic: str, queue_id: int, offset: int, wake: Callable[[], None]) -> tuple:
        with self._lock:
            self._next += 1
            token = self._next
            self._waiters.setdefault((topic, queue_id), {})[token] = (offset, wake)
        return (topic, queue_id, token)

    def cancel(self, handle: tuple) -> None:
        topic, queue_id, token = handle
        with self._lock:
            w = self._waiters.get((topic, queue_id))
            if w is not None:
                w.pop(token, None)
                if not w:
                    del self._waiters[(topic, queue_id)]

    def notify_message_arriving(self, batch: dict[tuple[str, int], int]) -> None:
        if not self._waiters:
            return
        woken = []
        with self._lock:
            for key, max_offset in batch.items():
                w = self._waiters.get(key)
                if not w:
                    continue
                for token in [t for t, (off, _) in w.items() if max_offset > off]:
                    woken.append(w.pop(token)[1])
                if not w:
                    del self._waiters[key]
        for wake in woken:
            try:
                wake()
            except Exception:
                log.exception("waking a held pull failed")

    def held_count(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())


_CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY", 2: "CONSUME_POP"}
_MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}

_PUT_STATUS_CODES = {
    PutMessageStatus.PUT_OK: ResponseCode.SUCCESS,
    PutMessageStatus.FLUSH_DISK_TIMEOUT: ResponseCode.FLUSH_DISK_TIMEOUT,
    PutMessageStatus.FLUSH_SLAVE_TIMEOUT: ResponseCode.FLUSH_SLAVE_TIMEOUT,
    PutMessageStatus.SLAVE_NOT_AVAILABLE: ResponseCode.SLAVE_NOT_AVAILABLE,
    PutMessageStatus.MESSAGE_ILLEGAL: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.PROPERTIES_SIZE_EXCEEDED: ResponseCode.MESSAGE_ILLEGAL,
    PutMessageStatus.SERVICE_NOT_AVAILABLE: ResponseCode.SERVICE_NOT_AVAILABLE,
    PutMessageStatus.OS_PAGE_CACHE_BUSY: ResponseCode.SYSTEM_BUSY,
}


def _enum_name(value: Any, table: dict[int, str]) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return table.get(value, str(value))
    return str(value) if value is not None else ""


def parse_json_body(body: bytes, what: str) -> Any:
    """A request's JSON body: strict JSON first, then fastjson's dialect (unquoted integer keys)."""
    try:
        text = body.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise HeaderError(f"{what} body is not UTF-8") from None
    try:
        return json.loads(text)
    except ValueError:
        try:
            return fastjson_loads(text)
        except (ConfigFileError, ValueError, RecursionError) as e:
            raise HeaderError(f"{what} body is not JSON: {e}") from None
    except RecursionError:
        raise HeaderError(f"{what} body nests too deeply") from None


class Broker:
    """A RocketMQ broker over one `MessageStore` (see the module docstring); thread-safe.

    `start()` registers the long-polling hook and starts the delay-level and housekeeping threads;
    `shutdown()` stops them and persists offsets (the store itself is closed by its owner).
    """

    def __init__(self, store: MessageStore, config: BrokerConfig | None = None, broker_addr: str | None = None,
                 **overrides: Any) -> None:
        cfg = config or BrokerConfig()
        for k, v in overrides.items():
            if not hasattr(cfg, k):
                raise TypeError(f"unknown broker setting {k!r}")
            setattr(cfg, k, v)
        self.config = cfg
        self.store = store
        self.broker_addr = broker_addr or store.config.store_host
        self.topic_config_manager = store.topic_config_manager
        self.consumer_offset_manager = store.consumer_offset_manager
        self.subscription_group_manager = store.subscription_group_manager
        self.hold_service = PullRequestHoldService()
        self.schedule_service = ScheduleMessageService(store, cfg.message_delay_level)
        self._clients_lock = threading.RLock()
        self._consumers: dict[str, dict[str, ClientInfo]] = {}
        self._producers: dict[str, dict[str, ClientInfo]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._topic_lock = threading.Lock()
        self._tc_cache: dict[str, TopicConfig] = {}
        self._tc_key: tuple[int, int] = (-1, -1)
        self._sg_cache: dict[str, SubscriptionGroupConfig] = {}
        self._sg_key: tuple[int, int] = (-1, -1)
        self._uniq_ids = codec.UniqueIdGenerator()  # UNIQ_KEY for messages a producer sent without one
        self._processors: dict[int, Callable[[RemotingCommand, Any], Any]] = {
            RequestCode.SEND_MESSAGE: self._send_message,
            RequestCode.SEND_MESSAGE_V2: self._send_message,
            RequestCode.SEND_BATCH_MESSAGE: self._send_message,
            RequestCode.PULL_MESSAGE: self.process_pull,
            RequestCode.QUERY_MESSAGE: self._query_message,
            RequestCode.VIEW_MESSAGE_BY_ID: self._view_message_by_id,
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_consumer_offset,
            RequestCode.HEART_BEAT: self._heart_beat,
            RequestCode.UNREGISTER_CLIENT: self._unregister_client,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._get_consumer_list_by_group,
            RequestCode.GET_MAX_OFFSET: self._get_max_offset,
            RequestCode.GET_MIN_OFFSET: self._get_min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self._get_earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset_by_timestamp,
            RequestCode.CONSUMER_SEND_MSG_BACK: self._consumer_send_msg_back,
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._get_all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._get_all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self._get_all_delay_offset,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self._update_and_create_subscription_group,
        }
        self._namesrv_processors: dict[int, Callable[[RemotingCommand, Any], Any]] = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._get_route_info_by_topic,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._get_all_topic_list,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._get_broker_cluster_info,
        }

    # -- lifecycle ----------------------------------------------------------------------------------
    def start(self) -> None:
        if self._started:
            return
        self._started = True
        self.store.add_message_arriving_listener(self._on_message_arriving)
        if self.config.auto_create_topic_enable and AUTO_CREATE_TOPIC_KEY_TOPIC not in self.topic_config_manager:
            perm = PermName.PERM_READ | PermName.PERM_WRITE | PermName.PERM_INHERIT
            self.topic_config_manager.put(TopicConfig(AUTO_CREATE_TOPIC_KEY_TOPIC, 8, 8, perm))
        self.schedule_service.start()
        self._thread = threading.Thread(target=self._housekeeping, name="BrokerScheduledTasks", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        """Stop the threads and persist consumer and delay offsets (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.schedule_service.shutdown()
        self.persist_consumer_offsets()

    def persist_consumer_offsets(self) -> None:
        try:
            self.consumer_offset_manager.persist()
        except Exception:
            log.exception("could not persist consumerOffset.json")

    def _housekeeping(self) -> None:
        interval = self.config.flush_consumer_offset_interval / 1000.0
        last_flush = last_scan = time.monotonic()
        while not self._stop.wait(0.5):
            now = time.monotonic()
            if now - last_flush >= interval:
                last_flush = now
                self.persist_consumer_offsets()
            if now - last_scan >= 10:
                last_scan = now
                self.scan_not_active_channels()

    def _on_message_arriving(self, batch: dict[tuple[str, int], int]) -> None:
        self.hold_service.notify_message_arriving(batch)

    # -- dispatch -------------------------------------------------------------------------------------
    def process(self, request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        """Serve one broker request; errors become SYSTEM_ERROR responses with the reason as remark."""
        return self._run(self._processors, request, channel)

    def process_namesrv(self, request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        """Serve one name-server request (this broker is its own, single-broker name server)."""
        return self._run(self._namesrv_processors, request, channel)

    def _run(self, table: dict, request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        fn = table.get(request.code)
        if fn is None:
            return request.response(ResponseCode.REQUEST_CODE_NOT_SUPPORTED,
                                    f" request type {request.code} not supported")
        try:
            return fn(request, channel)
        except HeaderError as e:
            return request.response(ResponseCode.SYSTEM_ERROR, str(e))
        except TopicValidationError as e:
            return request.response(ResponseCode.SYSTEM_ERROR, str(e))
        except Exception as e:
            log.exception("request %d failed", request.code)
            return request.response(ResponseCode.SYSTEM_ERROR, f"{type(e).__name__}: {e}")

    # -- topics and groups ------------------------------------------------------------------------------
    def topic_config(self, topic: str) -> TopicConfig | None:
        """The topic's config (read-only: do not modify), cached until topics.json's data version moves."""
        dv = self.topic_config_manager.data_version
        key = (dv.counter, dv.timestamp)
        cache = self._tc_cache
        if key != self._tc_key:
            cache = self._tc_cache = {}
            self._tc_key = key
        tc = cache.get(topic)
        if tc is None:
            tc = self.topic_config_manager.get(topic)
            if tc is not None and len(cache) < 100_000:
                cache[topic] = tc
        return tc

    def find_subscription_group(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config (read-only: do not modify), cached until subscriptionGroup.json's data version
        moves; auto-created (and persisted) when `auto_create_subscription_group`."""
        sgm = self.subscription_group_manager
        dv = sgm.data_version
        key = (dv.counter, dv.timestamp)
        cache = self._sg_cache
        if key != self._sg_key:
            cache = self._sg_cache = {}
            self._sg_key = key
        cfg = cache.get(group)
        if cfg is not None:
            return cfg
        cfg = sgm.get(group)
        if cfg is None and self.config.auto_create_subscription_group and is_valid_group(group):
            cfg = SubscriptionGroupConfig(group)
            sgm.put(cfg)
        if cfg is not None and len(cache) < 100_000:
            cache[group] = cfg
        return cfg

    def _ensure_topic(self, topic: str, queue_nums: int, perm: int = PermName.PERM_READ | PermName.PERM_WRITE,
                      topic_sys_flag: int = 0) -> TopicConfig:
        tcm = self.topic_config_manager
        tc = tcm.get(topic)
        if tc is not None:
            return tc
        with self._topic_lock:
            tc = tcm.get(topic)
            if tc is None:
                tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
                tcm.put(tc)
                log.info("created topic %s with %d queues", topic, queue_nums)
        return tc

    def create_retry_topic(self, group: str) -> TopicConfig | None:
        sg = self.find_subscription_group(group)
        if sg is None or sg.retry_queue_nums <= 0:
            return None
        return self._ensure_topic(RETRY_GROUP_TOPIC_PREFIX + group, sg.retry_queue_nums)

    def create_topic(self, topic: str, read_queue_nums: int = 4, write_queue_nums: int = 4,
                     perm: int = PermName.PERM_READ | PermName.PERM_WRITE, order: bool = False) -> TopicConfig:
        """Create or update a topic (`UPDATE_AND_CREATE_TOPIC`); system topics are refused."""
        validate_topic(topic)
        if is_system_topic(topic):
            raise TopicValidationError(f"The topic[{topic}] is conflict with system topic.")
        if not (0 < read_queue_nums <= 1024 and 0 < write_queue_nums <= 1024):
            raise ValueError("queue numbers must be within 1..1024")
        old = self.topic_config_manager.get(topic)
        tc = old.copy() if old is not None else TopicConfig(topic)
        tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.order = read_queue_nums, write_queue_nums, perm, order
        self.topic_config_manager.put(tc)
        return tc

    def _auto_topic(self, topic: str) -> TopicConfig | None:
        """The config the first send will create for an unknown topic (not persisted), or None when
        topics are not auto-created or the name is not one a client may create."""
        if (not self.config.auto_create_topic_enable or is_not_allowed_send_topic(topic) or is_system_topic(topic)
                or topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)):
            return None
        try:
            validate_topic(topic)
        except (TopicValidationError, TypeError):
            return None
        n = self.config.default_topic_queue_nums
        return TopicConfig(topic, n, n)

    def route_data(self, topic: str) -> dict[str, Any] | None:
        """`TopicRouteData` for a topic (None when unknown and not auto-creatable)."""
        tc = self.topic_config(topic)
        if tc is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = self.create_retry_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
            else:
                tc = self._auto_topic(topic)
        if tc is None:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": self.config.broker_name, "readQueueNums": tc.read_queue_nums,
                            "writeQueueNums": tc.write_queue_nums, "perm": tc.perm,
                            "topicSysFlag": tc.topic_sys_flag}],
            "brokerDatas": [{"cluster": self.config.broker_cluster_name, "brokerName": self.config.broker_name,
                             "brokerAddrs": {str(MASTER_ID): self.broker_addr}}],
            "filterServerTable": {},
        }

    # -- name server ------------------------------------------------------------------------------------
    def _get_route_info_by_topic(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        topic = req.get_str("topic")
        route = self.route_data(topic)
        if route is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")
        return req.response(body=json.dumps(route, separators=(",", ":")).encode())

    def _get_all_topic_list(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        topics = [tc.topic_name for tc in self.topic_config_manager.list()]
        return req.response(body=json.dumps({"topicList": topics, "brokerAddr": None}).encode())

    def _get_broker_cluster_info(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        c = self.config
        body = {"brokerAddrTable": {c.broker_name: {"cluster": c.broker_cluster_name, "brokerName": c.broker_name,
                                                    "brokerAddrs": {str(MASTER_ID): self.broker_addr}}},
                "clusterAddrTable": {c.broker_cluster_name: [c.broker_name]}}
        return req.response(body=json.dumps(body).encode())

    # -- send ---------------------------------------------------------------------------------------------
    def _send_message(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        # 310 and 320 carry SendMessageRequestHeaderV2's short names; 10 the long ones (mapping both is safe).
        h = send_header_v1(req.ext_fields)
        hreq = RemotingCommand(req.code, h)
        batch = req.code == RequestCode.SEND_BATCH_MESSAGE or hreq.get_bool("batch", False)
        topic = hreq.get_str("topic")
        queue_id = hreq.get_int("queueId", -1)
        sys_flag = hreq.get_int("sysFlag", 0)
        born_ts = hreq.get_int("bornTimestamp", 0)
        flag = hreq.get_int("flag", 0)
        props = hreq.get_str("properties", "") or ""
        reconsume = hreq.get_int("reconsumeTimes", 0)
        max_reconsume = hreq.get_int("maxReconsumeTimes", None)
        default_nums = hreq.get_int("defaultTopicQueueNums", self.config.default_topic_queue_nums)
        born_host = getattr(channel, "remote_address", None) or None
        if batch:
            try:
                inner = codec.decode_batch_body(req.body)
            except ValueError as e:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, f"bad batch body: {e}")
            if not inner:
                return req.response(ResponseCode.MESSAGE_ILLEGAL, "empty batch")
            msgs = [Message(topic=topic, body=b, queue_id=queue_id, flag=f, properties_string=p, sys_flag=sys_flag,
                            born_timestamp=born_ts, born_host=born_host, reconsume_times=reconsume)
                    for b, f, p in inner]
        else:
            msgs = [Message(topic=topic, body=req.body, queue_id=queue_id, flag=flag, properties_string=props,
                            sys_flag=sys_flag, born_timestamp=born_ts, born_host=born_host,
                            reconsume_times=reconsume)]
        code, remark, ext = self.send_messages(msgs, max_reconsume_times=max_reconsume,
                                               default_topic_queue_nums=default_nums, batch=batch)
        return req.response(code, remark, ext)

    def send_messages(self, msgs: list[Message], *, max_reconsume_times: int | None = None,
                      default_topic_queue_nums: int | None = None,
                      batch: bool = False) -> tuple[int, str | None, dict[str, Any] | None]:
        """Check, route and store messages of one topic and queue (`SendMessageProcessor`).

        Returns (response code, remark, response extFields: msgId, queueId, queueOffset).
        """
        store = self.store
        first = msgs[0]
        topic = first.topic
        try:
            validate_topic(topic)
        except (TopicValidationError, TypeError) as e:
            return ResponseCode.SYSTEM_ERROR, str(e), None
        if is_not_allowed_send_topic(topic):
            return ResponseCode.NO_PERMISSION, f"Sending message to topic[{topic}] is forbidden.", None
        if codec.transaction_value(first.sys_flag) in (codec.TRANSACTION_PREPARED_TYPE,
                                                       codec.TRANSACTION_ROLLBACK_TYPE):
            return (ResponseCode.NO_PERMISSION,
                    "the broker[rmq_eventstore] sending transaction message is forbidden (not supported yet)", None)
        tc = self.topic_config(topic)
        if tc is None:
            if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
                tc = self.create_retry_topic(topic[len(RETRY_GROUP_TOPIC_PREFIX):])
            elif self.config.auto_create_topic_enable:
                # min(client's defaultTopicQueueNums, the broker's), as createTopicInSendMessageMethod
                n = self.config.default_topic_queue_nums
                if default_topic_queue_nums is not None and default_topic_queue_nums > 0:
                    n = min(n, default_topic_queue_nums)
                tc = self._ensure_topic(topic, n)
            if tc is None:
                return ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!", None
        if not PermName.is_writeable(tc.perm):
            return ResponseCode.NO_PERMISSION, f"the topic[{topic}] sending message is forbidden", None
        queue_id = first.queue_id
        if queue_id < 0:
            queue_id = random.randrange(max(tc.write_queue_nums, 1))
        elif queue_id >= max(tc.write_queue_nums, tc.read_queue_nums):
            return (ResponseCode.SYSTEM_ERROR,
                    f"request queueId[{queue_id}] is illegal, topic: {topic} writeQueueNums: "
                    f"{tc.write_queue_nums} readQueueNums: {tc.read_queue_nums}", None)
        # Retry topic over its limit → the group's DLQ (handleRetryAndDLQ).
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX) and not batch:
            group = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            sg = self.find_subscription_group(group)
            limit = max_reconsume_times if max_reconsume_times is not None else (sg.retry_max_times if sg else 16)
            if first.reconsume_times >= limit:
                dlq = DLQ_GROUP_TOPIC_PREFIX + group
                self._ensure_topic(dlq, DLQ_NUMS_PER_GROUP)
                topic, queue_id = dlq, 0
        max_level = self.schedule_service.max_level
        delayed = False
        uniq_marker = PROPERTY_UNIQ_KEY + codec.NAME_VALUE_SEPARATOR
        cluster_marker = PROPERTY_CLUSTER + codec.NAME_VALUE_SEPARATOR
        cluster = f"{cluster_marker}{self.config.broker_cluster_name}{codec.PROPERTY_SEPARATOR}"
        auto_uniq = store.config.auto_create_uniq_key
        sep = codec.PROPERTY_SEPARATOR
        for m in msgs:
            m.topic = topic
            m.queue_id = queue_id
            props = m.properties_string or ""
            # absent properties are appended (what set_property does when there is nothing to remove)
            if auto_uniq and uniq_marker not in props:
                if props and not props.endswith(sep):
                    props += sep
                props += f"{uniq_marker}{self._uniq_ids.create()}{sep}"
            if cluster_marker not in props:
                if props and not props.endswith(sep):
                    props += sep
                props += cluster
            m.properties_string = props
            if "DELAY" in props:
                if batch:
                    if transform_delay_level_message(Message(topic, properties_string=props), max_level):
                        return ResponseCode.MESSAGE_ILLEGAL, "a batch may not hold delayed messages", None
                elif topic.startswith(DLQ_GROUP_TOPIC_PREFIX):
                    m.properties_string = codec.delete_property(props, "DELAY")
                elif transform_delay_level_message(m, max_level):
                    delayed = True
        res = store.put_messages(msgs) if batch else store.put_message(msgs[0])
        if delayed:
            self.schedule_service.wakeup()
        code = _PUT_STATUS_CODES.get(res.status, ResponseCode.SYSTEM_ERROR)
        a = res.append_result
        if a is None or not res.is_ok():
            return code, f"{res.status.name}: {res.reason}" if res.reason else res.status.name, None
        ext = {"msgId": a.msg_id, "queueId": queue_id, "queueOffset": a.logics_offset,
               "MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
        return code, None, ext

    def put_message(self, msg: Message) -> tuple[int, str | None, dict[str, Any] | None]:
        """In-process send of one message through the broker's checks (delay levels, retry, DLQ)."""
        if msg.properties_string is None:
            msg.properties_string = codec.build_properties_string(msg, msg.uniq_key)
        return self.send_messages([msg])

    # -- pull ---------------------------------------------------------------------------------------------
    def process_pull(self, req: RemotingCommand, channel: Any, allow_suspend: bool = True) -> RemotingCommand | PullHold:
        """`PullMessageProcessor.processRequest`."""
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        queue_id = req.get_int("queueId")
        offset = req.get_int("queueOffset")
        max_nums = req.get_int("maxMsgNums")
        sys_flag = req.get_int("sysFlag", 0)
        commit_offset = req.get_int("commitOffset", 0)
        suspend_ms = req.get_int("suspendTimeoutMillis", 0)
        if max_nums <= 0:
            max_nums = 1
        max_nums = min(max_nums, self.config.max_pull_msg_nums)
        sg = self.find_subscription_group(group)
        if sg is None:
            return req.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                f"subscription group [{group}] does not exist")
        if not sg.consume_enable:
            return req.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = self.topic_config(topic)
        if tc is None:
            tc = self._auto_topic(topic)  # a consumer may start before the first send creates the topic
            if tc is None:
                return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not PermName.is_readable(tc.perm):
            return req.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                f"[{tc.read_queue_nums}] consumer:[{getattr(channel, 'remote_address', '')}]")
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            expr_type = req.get_str("expressionType", "TAG") or "TAG"
            if expr_type.upper() != "TAG":
                return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                    f"The broker does not support consumer to filter message by {expr_type}")
            expression = req.get_str("subscription", "*")
        else:
            expression = self._registered_subscription(group, topic)
            if expression is None:
                return req.response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                    f"the consumer's subscription not exist, group: {group} topic: {topic}")
        r = self.store.get_message(group, topic, queue_id, offset, max_nums, MessageFilter(expression))
        if r is None:
            return req.response(ResponseCode.SYSTEM_ERROR, "store getMessage return null")
        ext = {"nextBeginOffset": r.next_begin_offset, "minOffset": r.min_offset, "maxOffset": r.max_offset,
               "suggestWhichBrokerId": MASTER_ID}
        st = r.status
        body = b""
        if st == GetMessageStatus.FOUND:
            code = ResponseCode.SUCCESS
            body = b"".join(r.message_buffers)
        elif st in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        elif st in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        elif st in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
            code = ResponseCode.PULL_NOT_FOUND
        else:  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL, OFFSET_RESET
            code = ResponseCode.PULL_OFFSET_MOVED
        if allow_suspend and sys_flag & PULL_FLAG_COMMIT_OFFSET:
            self.commit_offset(group, topic, queue_id, commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
            timeout = suspend_ms if self.config.long_polling_enable else self.config.short_polling_time_mills
            timeout = max(0, min(timeout, self.config.max_suspend_timeout_mills))
            if timeout > 0:
                return PullHold(req, topic, queue_id, offset, timeout)
        return req.response(code, None if code == ResponseCode.SUCCESS else st.name, ext, body)

    def pull_blocking(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int = 32,
                      expression: str = "*", suspend_timeout_ms: int = 0) -> RemotingCommand:
        """In-process pull with long polling (blocks the calling thread up to `suspend_timeout_ms`)."""
        sys_flag = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_timeout_ms > 0 else 0)
        req = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_timeout_ms, "subscription": expression, "subVersion": 0})
        r = self.process(req, None)
        if isinstance(r, PullHold):
            ev = threading.Event()
            handle = self.wait_for_arrival(r, ev.set)
            try:
                ev.wait(r.timeout_ms / 1000.0)
            finally:
                self.hold_service.cancel(handle)
            r = self.process_pull(req, None, allow_suspend=False)
        assert isinstance(r, RemotingCommand)
        return r

    def wait_for_arrival(self, hold: PullHold, wake: Callable[[], None]) -> tuple:
        """Register `wake` for the held pull; returns a handle for `hold_service.cancel`. Calls `wake`
        at once if a message arrived between the pull and this registration."""
        handle = self.hold_service.hold(hold.topic, hold.queue_id, hold.offset, wake)
        if self.store.get_max_offset_in_queue(hold.topic, hold.queue_id) > hold.offset:
            self.hold_service.cancel(handle)
            wake()
        return handle

    def _registered_subscription(self, group: str, topic: str) -> str | None:
        with self._clients_lock:
            for info in self._consumers.get(group, {}).values():
                sub = info.subscriptions.get(topic)
                if sub is not None:
                    return sub
        return None

    # -- offsets ------------------------------------------------------------------------------------------
    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.consumer_offset_manager.commit_offset(group, topic, queue_id, offset)

    def query_offset(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's next offset (`QUERY_CONSUMER_OFFSET`): committed, else 0 for a queue that still
        starts at 0, else None (QUERY_NOT_FOUND)."""
        off = self.consumer_offset_manager.query_offset(group, topic, queue_id)
        if off >= 0:
            return off
        if self.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return 0
        return None

    def _query_consumer_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        off = self.query_offset(req.get_str("consumerGroup"), req.get_str("topic"), req.get_int("queueId"))
        if off is None:
            return req.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer "
                                                              "boot first")
        return req.response(ext_fields={"offset": off})

    def _update_consumer_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        self.commit_offset(req.get_str("consumerGroup"), req.get_str("topic"), req.get_int("queueId"),
                           req.get_int("commitOffset"))
        return req.response()

    def _get_max_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        off = self.store.get_max_offset_in_queue(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"offset": off})

    def _get_min_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        off = self.store.get_min_offset_in_queue(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"offset": max(off, 0)})

    def _get_earliest_msg_storetime(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        ts = self.store.get_earliest_message_time(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"timestamp": ts})

    def _search_offset_by_timestamp(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        off = self.store.get_offset_in_queue_by_time(req.get_str("topic"), req.get_int("queueId"),
                                                     req.get_int("timestamp"))
        return req.response(ext_fields={"offset": off})

    # -- query ----------------------------------------------------------------------------------------------
    def _query_message(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        topic = req.get_str("topic")
        key = req.get_str("key")
        max_num = min(max(req.get_int("maxNum", 32), 1), self.config.default_query_max_num)
        begin = req.get_int("beginTimestamp", 0)
        end = req.get_int("endTimestamp", 2**62)
        r = self.store.query_message(topic, key, max_num, begin, end)
        bufs = [b for b in (self.store.select_one_message_by_offset(m.commit_log_offset) for m in r.messages) if b]
        ext = {"indexLastUpdateTimestamp": r.index_last_update_timestamp,
               "indexLastUpdatePhyoffset": r.index_last_update_phyoffset}
        if not bufs:
            return req.response(ResponseCode.QUERY_NOT_FOUND,
                                "can not find message, maybe time range not correct", ext)
        return req.response(ext_fields=ext, body=b"".join(bufs))

    def _view_message_by_id(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        offset = req.get_int("offset")
        buf = self.store.select_one_message_by_offset(offset) if offset >= 0 else None
        if not buf:
            return req.response(ResponseCode.SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return req.response(body=buf)

    # -- clients --------------------------------------------------------------------------------------------
    def _heart_beat(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        data = parse_json_body(req.body, "heartbeat")
        if not isinstance(data, dict):
            raise HeaderError("heartbeat body is not a JSON object")
        client_id = str(data.get("clientID") or "")
        if not client_id:
            raise HeaderError("heartbeat without clientID")
        now = time.monotonic()
        changed_groups = []
        consumers = data.get("consumerDataSet") or []
        producers = data.get("producerDataSet") or []
        if not isinstance(consumers, list) or not isinstance(producers, list):
            raise HeaderError("heartbeat consumerDataSet / producerDataSet must be lists")
        if len(consumers) + len(producers) > MAX_GROUPS_PER_HEARTBEAT:
            raise HeaderError(f"heartbeat names more than {MAX_GROUPS_PER_HEARTBEAT} groups")
        for cd in consumers:
            if not isinstance(cd, dict) or not isinstance(cd.get("groupName"), str):
                continue
            group = cd["groupName"]
            if not is_valid_group(group):
                continue
            sg = self.find_subscription_group(group)
            if sg is None:
                continue
            subs: dict[str, str] = {}
            for sd in cd.get("subscriptionDataSet") or []:
                if isinstance(sd, dict) and isinstance(sd.get("topic"), str):
                    subs[sd["topic"]] = str(sd.get("subString") or "*")
            info = ClientInfo(client_id, channel, req.language, req.version, now, subs,
                              _enum_name(cd.get("consumeType"), _CONSUME_TYPES),
                              _enum_name(cd.get("messageModel"), _MESSAGE_MODELS))
            with self._clients_lock:
                members = self._consumers.setdefault(group, {})
                if client_id not in members:
                    changed_groups.append(group)
                members[client_id] = info
            self.create_retry_topic(group)
        for pd in producers:
            if isinstance(pd, dict) and isinstance(pd.get("groupName"), str):
                with self._clients_lock:
                    self._producers.setdefault(pd["groupName"], {})[client_id] = ClientInfo(
                        client_id, channel, req.language, req.version, now)
        for group in changed_groups:
            self.notify_consumer_ids_changed(group)
        return req.response()

    def _unregister_client(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        client_id = req.get_str("clientID")
        pg = req.get_str("producerGroup", None)
        cg = req.get_str("consumerGroup", None)
        with self._clients_lock:
            if pg:
                self._producers.get(pg, {}).pop(client_id, None)
            removed = bool(cg) and self._consumers.get(cg, {}).pop(client_id, None) is not None
        if removed:
            self.notify_consumer_ids_changed(cg)
        return req.response()

    def consumer_ids(self, group: str) -> list[str]:
        with self._clients_lock:
            return list(self._consumers.get(group, {}))

    def _get_consumer_list_by_group(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        ids = self.consumer_ids(group)
        if not ids:
            return req.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(body=json.dumps({"consumerIdList": ids}).encode())

    def notify_consumer_ids_changed(self, group: str) -> None:
        """Tell every consumer of the group to rebalance (a oneway NOTIFY_CONSUMER_IDS_CHANGED)."""
        with self._clients_lock:
            channels = [i.channel for i in self._consumers.get(group, {}).values()]
        for ch in channels:
            send = getattr(ch, "send_oneway", None)
            if send is not None:
                try:
                    send(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED,
                                                 {"consumerGroup": group}, oneway=True))
                except Exception:
                    log.debug("notify %s failed", group, exc_info=True)

    def on_channel_closed(self, channel: Any) -> None:
        """Forget every registration made over a closed connection (`doChannelCloseEvent`)."""
        self._drop_clients(lambda info: info.channel is channel)

    def scan_not_active_channels(self) -> None:
        """Drop clients silent for longer than `channel_expired_timeout` (`ClientHousekeepingService`)."""
        limit = time.monotonic() - self.config.channel_expired_timeout / 1000.0
        self._drop_clients(lambda info: info.last_update < limit)

    def _drop_clients(self, gone_if: Callable[[ClientInfo], bool]) -> None:
        """Remove the producer and consumer registrations `gone_if` selects; tell the consumer groups."""
        changed = []
        with self._clients_lock:
            for table, is_consumer in ((self._consumers, True), (self._producers, False)):
                for group, members in list(table.items()):
                    gone = [cid for cid, info in members.items() if gone_if(info)]
                    for cid in gone:
                        del members[cid]
                    if gone and is_consumer:
                        changed.append(group)
                    if not members:
                        del table[group]
        for group in changed:
            self.notify_consumer_ids_changed(group)

    # -- retry / DLQ -----------------------------------------------------------------------------------------
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
        sg = self.find_subscription_group(group)
        if sg is None:
            return ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST, f"subscription group not exist, {group}"
        if sg.retry_queue_nums <= 0:
            return ResponseCode.SUCCESS, None
        msg = self.store.look_message_by_offset(commit_log_offset) if commit_log_offset >= 0 else None
        if msg is None:
            return ResponseCode.SYSTEM_ERROR, f"look message by offset failed, {commit_log_offset}"
        props = msg.properties_string
        if get_property(props, PROPERTY_RETRY_TOPIC) is None:
            props = set_property(props, PROPERTY_RETRY_TOPIC, msg.topic)
        limit = max_reconsume_times if max_reconsume_times is not None else sg.retry_max_times
        reconsume = msg.reconsume_times
        if reconsume >= limit or delay_level < 0:
            topic = DLQ_GROUP_TOPIC_PREFIX + group
            self._ensure_topic(topic, DLQ_NUMS_PER_GROUP)
            queue_id = 0
            props = codec.delete_property(props, "DELAY")
        else:
            topic = RETRY_GROUP_TOPIC_PREFIX + group
            tc = self.create_retry_topic(group)
            queue_id = random.randrange(max(tc.write_queue_nums if tc else 1, 1))
            props = set_property(props, "DELAY", str(delay_level if delay_level > 0 else 3 + reconsume))
        origin = get_property(props, PROPERTY_ORIGIN_MESSAGE_ID)
        if not origin:
            props = set_property(props, PROPERTY_ORIGIN_MESSAGE_ID, origin_msg_id or msg.msg_id)
        new = Message(topic=topic, body=bytes(msg.body), queue_id=queue_id, flag=msg.flag, properties_string=props,
                      sys_flag=msg.sys_flag, born_timestamp=msg.born_timestamp, born_host=msg.born_host,
                      reconsume_times=reconsume + 1)
        delayed = transform_delay_level_message(new, self.schedule_service.max_level)
        res = self.store.put_message(new)
        if delayed:
            self.schedule_service.wakeup()
        if res.is_ok():
            return ResponseCode.SUCCESS, None
        return ResponseCode.SYSTEM_ERROR, f"{res.status.name}: {res.reason}"

    # -- admin ----------------------------------------------------------------------------------------------
    def _update_and_create_topic(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        topic = req.get_str("topic")
        try:
            self.create_topic(topic, req.get_int("readQueueNums", 4), req.get_int("writeQueueNums", 4),
                              req.get_int("perm", PermName.PERM_READ | PermName.PERM_WRITE),
                              req.get_bool("order", False))
        except (TopicValidationError, ValueError) as e:
            return req.response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.response()

    def _get_all_topic_config(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        return req.response(body=self.topic_config_manager.encode(False).encode("utf-8"))

    def _get_all_consumer_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        return req.response(body=self.consumer_offset_manager.encode(False).encode("utf-8"))

    def _get_all_delay_offset(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        return req.response(body=self.store.delay_offset_manager.encode(False).encode("utf-8"))

    def _update_and_create_subscription_group(self, req: RemotingCommand, _ch: Any) -> RemotingCommand:
        doc = parse_json_body(req.body, "subscription group")
        try:
            cfg = SubscriptionGroupConfig.from_dict(doc)
            self.subscription_group_manager.put(cfg)
        except (ConfigFileError, ValueError) as e:
            return req.response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.response()
