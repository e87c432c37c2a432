"""Administration (`AdminBrokerProcessor`): topics and subscription groups created or updated, and the
config tables (topics, consumer offsets, delay offsets) read whole."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...common.fastjson import ConfigFileError
from ...common.topic import TopicValidationError
from ...common.topic_config import PermName, SubscriptionGroupConfig
from ...remoting import RemotingCommand, RequestCode, ResponseCode
from . import parse_json_body

if TYPE_CHECKING:
    from ..broker import Broker


class AdminBrokerProcessor:
    """UPDATE_AND_CREATE_TOPIC, GET_ALL_TOPIC_CONFIG, GET_ALL_CONSUMER_OFFSET, GET_ALL_DELAY_OFFSET,
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP."""

    CODES = (RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.GET_ALL_TOPIC_CONFIG,
             RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET,
             RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._handlers = {
            RequestCode.UPDATE_AND_CREATE_TOPIC: self._update_and_create_topic,
            RequestCode.GET_ALL_TOPIC_CONFIG: self._all_topic_config,
            RequestCode.GET_ALL_CONSUMER_OFFSET: self._all_consumer_offset,
            RequestCode.GET_ALL_DELAY_OFFSET: self._all_delay_offset,
            RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self._update_and_create_subscription_group,
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
