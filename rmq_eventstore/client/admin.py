"""`Admin`: the tools' side of the protocol (`MQAdminImpl` / `DefaultMQAdminExt`): create topics,
list them, look messages up by key or id, queue offsets, a group's consumer offset, and the statistics a
dashboard shows: a broker's runtime info, a topic's queues, a group's lag per queue (RocketMQ's
GET_BROKER_RUNTIME_INFO, GET_TOPIC_STATS_INFO, GET_CONSUME_STATS, so they work on Apache RocketMQ too)
and the broker's sampled history (GET_BROKER_STATS_HISTORY, our extension)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..common import MessageExt, codec
from ..common.fastjson import ObjectKey, fastjson_loads
from ..common.topic import validate_group, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from .base import ClientBase, TopicRoute, decode_records, loads_body
from .producer import ExtensionNotSupportedError


@dataclass(frozen=True)
class QueueOffsets:
    """One queue of GET_TOPIC_STATS_INFO's TopicStatsTable (`TopicOffset`)."""

    topic: str
    broker_name: str
    queue_id: int
    min_offset: int
    max_offset: int
    last_update_timestamp: int

    @property
    def count(self) -> int:
        """Messages still stored in the queue."""
        return max(self.max_offset - self.min_offset, 0)


@dataclass(frozen=True)
class QueueConsumeStats:
    """One queue of GET_CONSUME_STATS's ConsumeStats (`OffsetWrapper`)."""

    topic: str
    broker_name: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    pull_offset: int
    last_timestamp: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - self.consumer_offset, 0)


@dataclass
class ConsumeStats:
    """A group's ConsumeStats from every broker: its queues (sorted by topic, broker, queue) and consume TPS."""

    group: str
    queues: list[QueueConsumeStats] = field(default_factory=list)
    consume_tps: float = 0.0

    @property
    def lag(self) -> int:
        """RocketMQ's `computeTotalDiff`."""
        return sum(q.lag for q in self.queues)


def _queue_table(body: bytes) -> tuple[dict[str, Any], list[tuple[dict[str, Any], dict[str, Any]]]]:
    """A fastjson body with an ``offsetTable`` keyed by MessageQueue objects: (document, [(queue, value)])."""
    doc = fastjson_loads(body or b"{}")
    rows = []
    for key, value in (doc.get("offsetTable") or {}).items():
        mq = key.as_dict() if isinstance(key, ObjectKey) else (json.loads(key) if isinstance(key, str) else {})
        rows.append((mq, value if isinstance(value, dict) else {}))
    return doc, rows


class Admin:
    """Administrative requests against a name server and its brokers; thread-safe."""

    def __init__(self, namesrv_addr: str, timeout_ms: int = 5000, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        self._base = ClientBase(namesrv_addr, timeout_ms / 1000.0, access_key, secret_key)

    def start(self) -> Admin:
        return self

    def shutdown(self) -> None:
        self._base.shutdown()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def broker_addresses(self) -> dict[str, str]:
        """broker name → master address (GET_BROKER_CLUSTER_INFO)."""
        r = self._base.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_BROKER_CLUSTER_INFO))
        data = loads_body(r.body)
        out = {}
        for name, bd in (data.get("brokerAddrTable") or {}).items():
            addrs = bd.get("brokerAddrs") or {}
            master = addrs.get("0", addrs.get(0))
            if master:
                out[name] = master
        return out

    def create_topic(self, topic: str, queue_nums: int = 4, perm: int = 6, order: bool = False) -> None:
        """Create (or update) a topic on every broker (UPDATE_AND_CREATE_TOPIC)."""
        validate_topic(topic)
        for addr in self.broker_addresses().values():
            self._base.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_TOPIC, {
                "topic": topic, "defaultTopic": "TBW102", "readQueueNums": queue_nums, "writeQueueNums": queue_nums,
                "perm": perm, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0, "order": order}))

    def delete_topic(self, topic: str) -> None:
        """Delete a topic on every broker (DELETE_TOPIC_IN_BROKER), then in the name server
        (DELETE_TOPIC_IN_NAMESRV), as RocketMQ's `mqadmin deleteTopic` does: its config, queues, consumer
        offsets, pop retry topics and route go; its commitlog records stay until the commitlog expires.
        Deleting a topic the broker does not know succeeds (RocketMQ's answer). A system topic or a name
        that is no topic name is refused: `ValueError` here, or `MQBrokerError` (INVALID_PARAMETER) from
        the broker."""
        validate_topic(topic)
        for addr in self.broker_addresses().values():
            self._base.invoke(addr, RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_BROKER, {"topic": topic}))
        self._base.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.DELETE_TOPIC_IN_NAMESRV,
                                                                  {"topic": topic}))
        self._base.forget_route(topic)

    def create_subscription_group(self, group: str, retry_max_times: int = 16, **config: object) -> None:
        """Create (or update) a consumer group on every broker (UPDATE_AND_CREATE_SUBSCRIPTIONGROUP);
        `retry_max_times` is how often a message may come back before it goes to the group's DLQ.
        `config` takes more `SubscriptionGroupConfig` fields by RocketMQ's names (`consumeEnable`, ...)."""
        validate_group(group)
        body = json.dumps({"groupName": group, "retryMaxTimes": retry_max_times, **config}).encode()
        for addr in self.broker_addresses().values():
            self._base.invoke(addr, RemotingCommand.request(RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, {},
                                                            body))

    def topic_list(self) -> list[str]:
        r = self._base.invoke_namesrv(lambda: RemotingCommand.request(RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER))
        return list(loads_body(r.body).get("topicList") or [])

    def topic_route(self, topic: str) -> TopicRoute:
        return self._base.route(topic, refresh=True)

    def _queue_call(self, code: int, topic: str, queue_id: int, key: str, **extra: object) -> int:
        r = self._base.invoke(self._base.broker_for(topic), RemotingCommand.request(
            code, {"topic": topic, "queueId": queue_id, **extra}))
        return int(r.ext_fields.get(key, 0))

    def max_offset(self, topic: str, queue_id: int) -> int:
        return self._queue_call(RequestCode.GET_MAX_OFFSET, topic, queue_id, "offset")

    def min_offset(self, topic: str, queue_id: int) -> int:
        return self._queue_call(RequestCode.GET_MIN_OFFSET, topic, queue_id, "offset")

    def search_offset(self, topic: str, queue_id: int, timestamp_ms: int) -> int:
        """The first queue offset stored at or after `timestamp_ms` (SEARCH_OFFSET_BY_TIMESTAMP)."""
        return self._queue_call(RequestCode.SEARCH_OFFSET_BY_TIMESTAMP, topic, queue_id, "offset",
                                timestamp=timestamp_ms)

    def earliest_msg_store_time(self, topic: str, queue_id: int) -> int:
        return self._queue_call(RequestCode.GET_EARLIEST_MSG_STORETIME, topic, queue_id, "timestamp")

    def consumer_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset, or -1 (QUERY_CONSUMER_OFFSET)."""
        r = self._base.invoke(self._base.broker_for(topic), RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id}),
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        return int(r.ext_fields.get("offset", -1)) if r.code == ResponseCode.SUCCESS else -1

    def query_message(self, topic: str, key: str, max_num: int = 32, begin_timestamp: int = 0,
                      end_timestamp: int | None = None, *, brokers_of: str | None = None) -> list[MessageExt]:
        """Messages of `topic` whose KEYS (or UNIQ_KEY) hold `key`, from every broker (QUERY_MESSAGE): the
        brokers serving `topic`, or `brokers_of` (a system topic has no route of its own: the timer topic
        `rmq_sys_wheel_timer` is asked of the brokers of the topic its messages are for)."""
        out: list[MessageExt] = []
        route = self._base.route(brokers_of or topic)
        for addr in route.broker_addrs.values():
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.QUERY_MESSAGE, {
                "topic": topic, "key": key, "maxNum": max_num, "beginTimestamp": begin_timestamp,
                "endTimestamp": end_timestamp if end_timestamp is not None else 2**62}),
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if r.code == ResponseCode.SUCCESS:
                out += decode_records(r.body)
        return out

    def view_message(self, offset_msg_id: str) -> MessageExt:
        """The message with this offsetMsgId, asked of the broker the id names (VIEW_MESSAGE_BY_ID)."""
        host, port, offset = codec.decode_message_id(offset_msg_id)
        addr = codec.format_host(host, port)
        r = self._base.invoke(addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID, {"offset": offset}))
        msgs = decode_records(r.body)
        if not msgs:
            raise LookupError(f"no message {offset_msg_id}")
        return msgs[0]

    def supports(self, address: str, extension: str) -> bool:
        """Whether the broker at `address` serves one of rmq_eventstore's extensions (asked once, cached)."""
        return self._base.supports(address, extension)

    def read_stream(self, topic: str, stream: str, from_version: int = 1, max_num: int = 100_000, *,
                    last: int | None = None) -> list[MessageExt]:
        """The events of `stream` on `topic` from `from_version` on, in version order (QUERY_STREAM, our
        extension: RocketMQ's QUERY_MESSAGE returns at most 64 messages per key). `LookupError`-free: an
        unknown stream is an empty list. With `last`, only the stream's newest `last` events (the broker
        reads only the newest index entries: cheap however long the stream). Raises
        `ExtensionNotSupportedError` against Apache RocketMQ."""
        validate_topic(topic)
        out: list[MessageExt] = []
        for addr in self._base.route(topic).broker_addrs.values():
            if not self.supports(addr, "queryStreamLast" if last else "queryStream"):
                raise ExtensionNotSupportedError(
                    f"broker {addr} does not serve stream reads{' of the newest events' if last else ''} (an "
                    "Apache RocketMQ broker, or an older rmq_eventstore?); use query_message, which RocketMQ "
                    "caps at 64 messages per key")
            header: dict[str, object] = {"topic": topic, "stream": stream, "fromVersion": from_version,
                                         "maxNum": max_num}
            if last:
                header["last"] = last
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.QUERY_STREAM, header),
                                  ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if r.code == ResponseCode.SUCCESS:
                out += decode_records(r.body)
        out.sort(key=lambda m: int(m.properties.get("STREAM_VERSION", "0") or 0))
        return out[-last:] if last else out[:max_num]

    def transaction_ends(self, topic: str, transaction_ids: Sequence[str]) -> dict[str, str] | None:
        """How the brokers serving `topic` ended these transactions: {id: "COMMIT" | "ROLLBACK" | "DISCARDED"}
        for the ids a broker remembers ending (QUERY_TRANSACTION_ENDS, our extension; 10,000 ids a request).
        An id left out is open, or was ended before that broker's restart or long ago: look it up as before
        (`query_message` on its topic). None when a broker of the topic does not serve the extension."""
        validate_topic(topic)
        ids = list(transaction_ids)
        out: dict[str, str] = {}
        for addr in self._base.route(topic).broker_addrs.values():
            if not self.supports(addr, "transactionEnds"):
                return None
            for i in range(0, len(ids), 10_000):
                r = self._base.invoke(addr, RemotingCommand.request(
                    RequestCode.QUERY_TRANSACTION_ENDS, {"topic": topic},
                    body=json.dumps({"ids": ids[i:i + 10_000]}, separators=(",", ":")).encode()))
                out.update(json.loads(r.body or b"{}").get("ends") or {})
        return out

    def query_key_all(self, topic: str, key: str, max_num: int = 100_000) -> list[MessageExt]:
        """Every message of `topic` whose KEYS (or UNIQ_KEY) hold `key`, oldest first, without
        QUERY_MESSAGE's cap (QUERY_STREAM with a key; our extension). Against a broker without it, falls
        back to QUERY_MESSAGE and raises `ExtensionNotSupportedError` if that may have been cut short."""
        validate_topic(topic)
        out: list[MessageExt] = []
        for addr in self._base.route(topic).broker_addrs.values():
            if not self.supports(addr, "queryStream"):
                part = self.query_message(topic, key, 64)
                if len(part) >= 32:
                    raise ExtensionNotSupportedError(
                        f"broker {addr} caps key lookups (an Apache RocketMQ broker?) and {key!r} may have more")
                out += part
                continue
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.QUERY_STREAM, {
                "topic": topic, "key": key, "maxNum": max_num}), ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if r.code == ResponseCode.SUCCESS:
                out += decode_records(r.body)
        return out

    def view_message_at(self, topic: str | None, commit_log_offset: int) -> MessageExt | None:
        """The record at `commit_log_offset` on the broker serving `topic` (every broker when `topic` is None)
        (VIEW_MESSAGE_BY_ID by offset), or None when there is none."""
        addrs = self._base.route(topic).broker_addrs.values() if topic else self.broker_addresses().values()
        for addr in addrs:
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                                {"offset": commit_log_offset}),
                                  ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
            if r.code == ResponseCode.SUCCESS:
                msgs = decode_records(r.body)
                if msgs:
                    return msgs[0]
        return None

    # -- statistics (dashboards) ------------------------------------------------------------------------
    def _broker_address(self, broker: str | None) -> str:
        """`broker` as a name or an address; None: the first broker by name."""
        brokers = self.broker_addresses()
        if broker is None:
            if not brokers:
                raise LookupError("the name server knows no broker")
            return brokers[sorted(brokers)[0]]
        return brokers.get(broker, broker)

    def runtime_info(self, broker: str | None = None) -> dict[str, str]:
        """A broker's KVTable of GET_BROKER_RUNTIME_INFO (`broker`: a name or address; default the first)."""
        r = self._base.invoke(self._broker_address(broker),
                              RemotingCommand.request(RequestCode.GET_BROKER_RUNTIME_INFO, {}))
        table = fastjson_loads(r.body or b"{}").get("table") or {}
        return {str(k): str(v) for k, v in table.items()}

    def topic_stats(self, topic: str) -> list[QueueOffsets]:
        """Min and max offset and last store time of every queue of `topic` on every broker serving it
        (GET_TOPIC_STATS_INFO), sorted by broker and queue."""
        validate_topic(topic)
        out: list[QueueOffsets] = []
        for name, addr in sorted(self._base.route(topic, refresh=True).broker_addrs.items()):
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.GET_TOPIC_STATS_INFO, {"topic": topic}))
            for mq, v in _queue_table(r.body)[1]:
                out.append(QueueOffsets(str(mq.get("topic", topic)), str(mq.get("brokerName", name)),
                                        int(mq.get("queueId", 0)), int(v.get("minOffset", 0)),
                                        int(v.get("maxOffset", 0)), int(v.get("lastUpdateTimestamp", 0))))
        out.sort(key=lambda q: (q.broker_name, q.queue_id))
        return out

    def consume_stats(self, group: str, topic: str | None = None) -> ConsumeStats:
        """`group`'s offsets against every broker's (GET_CONSUME_STATS): of `topic`, or of every topic the
        group committed offsets on."""
        stats = ConsumeStats(group)
        header = {"consumerGroup": group, **({"topic": topic} if topic else {})}
        for name, addr in sorted(self.broker_addresses().items()):
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.GET_CONSUME_STATS, header))
            doc, rows = _queue_table(r.body)
            stats.consume_tps += float(doc.get("consumeTps") or 0.0)
            for mq, v in rows:
                stats.queues.append(QueueConsumeStats(
                    str(mq.get("topic", topic or "")), str(mq.get("brokerName", name)), int(mq.get("queueId", 0)),
                    int(v.get("brokerOffset", 0)), int(v.get("consumerOffset", 0)), int(v.get("pullOffset", 0)),
                    int(v.get("lastTimestamp", 0))))
        stats.queues.sort(key=lambda q: (q.topic, q.broker_name, q.queue_id))
        return stats

    def consumer_groups(self) -> dict[str, list[str]]:
        """group → the topics it committed offsets on, from every broker: the subscription groups
        (GET_ALL_SUBSCRIPTIONGROUP_CONFIG) and the groups of the consumer offsets (GET_ALL_CONSUMER_OFFSET)."""
        groups: dict[str, set[str]] = {}
        for addr in self.broker_addresses().values():
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, {}),
                                  ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))  # SYSTEM_ERROR: none
            if r.code == ResponseCode.SUCCESS:
                for name in (fastjson_loads(r.body or b"{}").get("subscriptionGroupTable") or {}):
                    groups.setdefault(str(name), set())
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.GET_ALL_CONSUMER_OFFSET, {}),
                                  ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
            if r.code == ResponseCode.SUCCESS:
                for key in (fastjson_loads(r.body or b"{}").get("offsetTable") or {}):
                    topic, sep, group = str(key).partition("@")
                    if sep:
                        groups.setdefault(group, set()).add(topic)
        return {g: sorted(t) for g, t in sorted(groups.items())}

    def stats_history(self, broker: str | None = None, since_ms: int = 0) -> dict[str, Any]:
        """The broker's samples of the last hour (GET_BROKER_STATS_HISTORY, our extension): ``intervalMillis``
        and ``samples`` (``t``, ``msgPutTotal``, ``commitLogMaxOffset``, ``dispatchBehindBytes``,
        ``groupLag``), oldest first. Raises `ExtensionNotSupportedError` against Apache RocketMQ."""
        addr = self._broker_address(broker)
        if not self.supports(addr, "statsHistory"):
            raise ExtensionNotSupportedError(f"broker {addr} keeps no statistics history (an Apache RocketMQ broker?)")
        r = self._base.invoke(addr, RemotingCommand.request(RequestCode.GET_BROKER_STATS_HISTORY, {"since": since_ms}))
        return dict(json.loads(r.body or b"{}"))
