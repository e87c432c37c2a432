"""Consumers' bookkeeping (`ConsumerManageProcessor` and the offset queries of `AdminBrokerProcessor`):
committed offsets, the group's members, queue offsets by position and by time."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...remoting import RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from ..broker import Broker


class ConsumerManageProcessor:
    """QUERY/UPDATE_CONSUMER_OFFSET, GET_CONSUMER_LIST_BY_GROUP, GET_MAX/MIN_OFFSET,
    GET_EARLIEST_MSG_STORETIME, SEARCH_OFFSET_BY_TIMESTAMP."""

    CODES = (RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
             RequestCode.GET_CONSUMER_LIST_BY_GROUP, RequestCode.GET_MAX_OFFSET, RequestCode.GET_MIN_OFFSET,
             RequestCode.GET_EARLIEST_MSG_STORETIME, RequestCode.SEARCH_OFFSET_BY_TIMESTAMP)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._handlers = {
            RequestCode.QUERY_CONSUMER_OFFSET: self._query_consumer_offset,
            RequestCode.UPDATE_CONSUMER_OFFSET: self._update_consumer_offset,
            RequestCode.GET_CONSUMER_LIST_BY_GROUP: self._consumer_list_by_group,
            RequestCode.GET_MAX_OFFSET: self._max_offset,
            RequestCode.GET_MIN_OFFSET: self._min_offset,
            RequestCode.GET_EARLIEST_MSG_STORETIME: self._earliest_msg_storetime,
            RequestCode.SEARCH_OFFSET_BY_TIMESTAMP: self._search_offset_by_timestamp,
        }

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        return self._handlers[req.code](req)

    def _query_consumer_offset(self, req: RemotingCommand) -> RemotingCommand:
        off = self.broker.offset_manager.query(req.get_str("consumerGroup"), req.get_str("topic"),
                                               req.get_int("queueId"))
        if off is None:
            return req.response(ResponseCode.QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer "
                                                              "boot first")
        return req.response(ext_fields={"offset": off})

    def _update_consumer_offset(self, req: RemotingCommand) -> RemotingCommand:
        self.broker.offset_manager.commit(req.get_str("consumerGroup"), req.get_str("topic"), req.get_int("queueId"),
                                          req.get_int("commitOffset"))
        return req.response()

    def _consumer_list_by_group(self, req: RemotingCommand) -> RemotingCommand:
        group = req.get_str("consumerGroup")
        ids = self.broker.client_manager.consumers.consumer_ids(group)
        if not ids:
            return req.response(ResponseCode.SYSTEM_ERROR, f"no consumer for this group, {group}")
        return req.response(body=json.dumps({"consumerIdList": ids}).encode())

    def _max_offset(self, req: RemotingCommand) -> RemotingCommand:
        off = self.broker.store.get_max_offset_in_queue(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"offset": off})

    def _min_offset(self, req: RemotingCommand) -> RemotingCommand:
        off = self.broker.store.get_min_offset_in_queue(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"offset": max(off, 0)})

    def _earliest_msg_storetime(self, req: RemotingCommand) -> RemotingCommand:
        ts = self.broker.store.get_earliest_message_time(req.get_str("topic"), req.get_int("queueId"))
        return req.response(ext_fields={"timestamp": ts})

    def _search_offset_by_timestamp(self, req: RemotingCommand) -> RemotingCommand:
        off = self.broker.store.get_offset_in_queue_by_time(req.get_str("topic"), req.get_int("queueId"),
                                                            req.get_int("timestamp"))
        return req.response(ext_fields={"offset": off})
