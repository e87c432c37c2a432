"""`Admin`: the tools' side of the protocol (`MQAdminImpl` / `DefaultMQAdminExt`): create topics,
list them, look messages up by key or id, queue offsets, a group's consumer offset."""

from __future__ import annotations

import json
import threading

from ..common import MessageExt, codec
from ..common.topic import validate_group, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from .base import ClientBase, TopicRoute, decode_records, loads_body
from .producer import ExtensionNotSupportedError


class Admin:
    """Administrative requests against a name server and its brokers; thread-safe."""

    def __init__(self, namesrv_addr: str, timeout_ms: int = 5000, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        self._base = ClientBase(namesrv_addr, timeout_ms / 1000.0, access_key, secret_key)
        self._extensions: dict[str, dict] = {}
        self._ext_lock = threading.Lock()

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
                      end_timestamp: int | None = None) -> list[MessageExt]:
        """Messages of `topic` whose KEYS (or UNIQ_KEY) hold `key`, from every broker (QUERY_MESSAGE)."""
        out: list[MessageExt] = []
        route = self._base.route(topic)
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
        """Whether the broker at `address` serves one of rmq_eventstore's extensions (asked once, cached;
        an Apache RocketMQ broker serves none)."""
        with self._ext_lock:
            known = self._extensions.get(address)
        if known is None:
            r = self._base.remoting.invoke(address, RemotingCommand.request(RequestCode.GET_BROKER_EXTENSIONS, {}),
                                           self._base.timeout)
            known = dict(json.loads(r.body or b"{}").get("extensions") or {}) if r.code == ResponseCode.SUCCESS else {}
            with self._ext_lock:
                self._extensions[address] = known
        return bool(known.get(extension))

    def read_stream(self, topic: str, stream: str, from_version: int = 1, max_num: int = 100_000) -> list[MessageExt]:
        """The events of `stream` on `topic` from `from_version` on, in version order (QUERY_STREAM, our
        extension: RocketMQ's QUERY_MESSAGE returns at most 64 messages per key). `LookupError`-free: an
        unknown stream is an empty list. Raises `ExtensionNotSupportedError` against Apache RocketMQ."""
        validate_topic(topic)
        out: list[MessageExt] = []
        for addr in self._base.route(topic).broker_addrs.values():
            if not self.supports(addr, "queryStream"):
                raise ExtensionNotSupportedError(
                    f"broker {addr} does not serve stream reads (an Apache RocketMQ broker?); use query_message, "
                    "which RocketMQ caps at 64 messages per key")
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.QUERY_STREAM, {
                "topic": topic, "stream": stream, "fromVersion": from_version, "maxNum": max_num}),
                ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
            if r.code == ResponseCode.SUCCESS:
                out += decode_records(r.body)
        out.sort(key=lambda m: int(m.properties.get("STREAM_VERSION", "0") or 0))
        return out[:max_num]

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

    def view_message_at(self, topic: str, commit_log_offset: int) -> MessageExt | None:
        """The record at `commit_log_offset` on the broker serving `topic` (VIEW_MESSAGE_BY_ID by offset), or
        None when there is none."""
        for addr in self._base.route(topic).broker_addrs.values():
            r = self._base.invoke(addr, RemotingCommand.request(RequestCode.VIEW_MESSAGE_BY_ID,
                                                                {"offset": commit_log_offset}),
                                  ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
            if r.code == ResponseCode.SUCCESS:
                msgs = decode_records(r.body)
                if msgs:
                    return msgs[0]
        return None
