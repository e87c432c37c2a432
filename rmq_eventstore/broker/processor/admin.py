"""Administration (`AdminBrokerProcessor`): topics and subscription groups created or updated, the
config tables (topics, consumer offsets, delay offsets, subscription groups) read whole, and the
statistics RocketMQ's tools and dashboards ask for: GET_BROKER_RUNTIME_INFO (a KVTable), GET_TOPIC_STATS_INFO
(a TopicStatsTable) and GET_CONSUME_STATS (a ConsumeStats), with RocketMQ's bodies: fastjson maps keyed by
MessageQueue objects written inline."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...common.fastjson import Bean, ConfigFileError, ObjectKey, fastjson_dumps
from ...common.topic import TopicValidationError
from ...common.topic_config import PermName, SubscriptionGroupConfig
from ...remoting import RemotingCommand, RequestCode, ResponseCode
from . import parse_json_body

if TYPE_CHECKING:
    from ..broker import Broker


class AdminBrokerProcessor:
    """UPDATE_AND_CREATE_TOPIC, GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, GET_ALL_SUBSCRIPTIONGROUP_CONFIG, GET_BROKER_RUNTIME_INFO,
    GET_TOPIC_STATS_INFO, GET_CONSUME_STATS."""

    CODES = (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.GET_ALL_TOPIC_CONFIG,
             RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET,
             RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP, RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG,
             RequestCode.GET_BROKER_RUNTIME_INFO, RequestCode.GET_TOPIC_STATS_INFO, RequestCode.GET_CONSUME_STATS)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._handlers = {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self._all_delay_offset,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self._update_and_create_subscription_group,
            RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self._all_subscription_group,
            RequestCode.GET_BROKER_RUNTIME_INFO: self._runtime_info,
            RequestCode.GET_TOPIC_STATS_INFO: self._topic_stats,
            RequestCode.GET_CONSUME_STATS: self._consume_stats,
        }

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        return self._handlers[req.code](req)

    def _update_and_create_topic(self, req: RemotingCommand) -> RemotingCommand:
        try:
            self.broker.topic_manager.create(req.get_str("topic"), req.get_int("readQueueNums", 4),
                                             req.get_int("writeQueueNums", 4),
                                             req.get_int("perm", PermName.PERM_READ | PermName.PERM_WRITE),
                                             req.get_bool("order", False))
        except (TopicValidationError, ValueError) as e:
            return req.response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.response()

    def _all_topic_config(self, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=self.broker.topic_manager.file.encode(False).encode("utf-8"))

    def _all_consumer_offset(self, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=self.broker.offset_manager.encode().encode("utf-8"))

    def _all_delay_offset(self, req: RemotingCommand) -> RemotingCommand:
        return req.response(body=self.broker.store.delay_offset_manager.encode(False).encode("utf-8"))

    def _update_and_create_subscription_group(self, req: RemotingCommand) -> RemotingCommand:
        doc = parse_json_body(req.body, "subscription group")
        try:
            self.broker.group_manager.put(SubscriptionGroupConfig.from_dict(doc))
        except (ConfigFileError, ValueError) as e:
            return req.response(ResponseCode.SYSTEM_ERROR, str(e))
        return req.response()

    def _all_subscription_group(self, req: RemotingCommand) -> RemotingCommand:
        """The SubscriptionGroupWrapper (subscriptionGroup.json's document), compact."""
        return req.response(body=self.broker.store.subscription_group_manager.encode(False).encode("utf-8"))

    def _runtime_info(self, req: RemotingCommand) -> RemotingCommand:
        """A KVTable ``{"table": {name: string value}}`` (see `BrokerStatsService.runtime_info`)."""
        table = self.broker.stats_service.runtime_info()
        return req.response(body=fastjson_dumps(Bean(table=table), False).encode("utf-8"))

    def _queue_key(self, topic: str, queue_id: int) -> ObjectKey:
        return ObjectKey.of({"brokerName": self.broker.config.broker_name, "queueId": queue_id, "topic": topic})

    def _topic_stats(self, req: RemotingCommand) -> RemotingCommand:
        """A TopicStatsTable: min and max offset and the last store time of every queue of the topic."""
        topic = req.get_str("topic")
        cfg = self.broker.topic_manager.get(topic)
        if cfg is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        store = self.broker.store
        table = {}
        for i in range(max(cfg.write_queue_nums, cfg.read_queue_nums)):
            low = max(store.get_min_offset_in_queue(topic, i), 0)
            high = max(store.get_max_offset_in_queue(topic, i), 0)
            last = store.get_message_store_timestamp(topic, i, high - 1) if high > 0 else 0
            table[self._queue_key(topic, i)] = Bean(minOffset=low, maxOffset=high, lastUpdateTimestamp=max(last, 0))
        doc = Bean(offsetTable=table, topicPutTps=0.0)
        return req.response(body=fastjson_dumps(doc, False).encode("utf-8"))

    def _consume_stats(self, req: RemotingCommand) -> RemotingCommand:
        """A ConsumeStats: per queue of the group's topics (``topicList``, else ``topic``, else every topic the
        group committed an offset on), the broker's max offset, the group's committed offset (0 when none, as
        RocketMQ answers), its pull offset (for a POP group past the pops whose checkpoints are buffered) and the store time of the last message it consumed."""
        group = req.get_str("consumerGroup")
        topic_list = [t for t in req.get_str("topicList", "").split(";") if t]
        topic = req.get_str("topic", "")
        offsets = self.broker.offset_manager.file
        topics = topic_list or ([topic] if topic else sorted(offsets.which_topic_by_consumer(group)))
        store = self.broker.store
        table = {}
        for t in topics:
            cfg = self.broker.topic_manager.get(t)
            if cfg is None:
                continue
            for i in range(cfg.read_queue_nums):
                broker_offset = max(store.get_max_offset_in_queue(t, i), 0)
                consumer_offset = max(offsets.query_offset(group, t, i), 0)
                pull_offset = max(consumer_offset, self.broker.offset_manager.pop_frontier(group, t, i))
                last = store.get_message_store_timestamp(t, i, consumer_offset - 1) if consumer_offset > 0 else 0
                table[self._queue_key(t, i)] = Bean(brokerOffset=broker_offset, consumerOffset=consumer_offset,
                                                   pullOffset=pull_offset, lastTimestamp=max(last, 0))
        doc = Bean(consumeTps=0.0, offsetTable=table)
        return req.response(body=fastjson_dumps(doc, False).encode("utf-8"))
