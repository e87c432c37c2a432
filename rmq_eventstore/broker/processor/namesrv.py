"""The name server's part (`DefaultRequestProcessor` of the namesrv): routes, the topic list and the
cluster, for a broker that is its own single-broker name server."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...remoting import RemotingCommand, RequestCode, ResponseCode
from ..config import MASTER_ID

if TYPE_CHECKING:
    from ..broker import Broker


class NameServerProcessor:
    """GET_ROUTEINFO_BY_TOPIC, GET_ALL_TOPIC_LIST_FROM_NAMESERVER, GET_BROKER_CLUSTER_INFO,
    DELETE_TOPIC_IN_NAMESRV."""

    CODES = (RequestCode.GET_ROUTEINFO_BY_TOPIC, RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER,
             RequestCode.GET_BROKER_CLUSTER_INFO, RequestCode.DELETE_TOPIC_IN_NAMESRV)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._handlers = {
            RequestCode.GET_ROUTEINFO_BY_TOPIC: self._route_info_by_topic,
            RequestCode.GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._all_topic_list,
            RequestCode.GET_BROKER_CLUSTER_INFO: self._broker_cluster_info,
            RequestCode.DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
        }

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        return self._handlers[req.code](req)

    def route_data(self, topic: str) -> dict[str, Any] | None:
        """`TopicRouteData` for a topic (None when unknown and not auto-creatable)."""
        b = self.broker
        tc = b.topic_manager.routable(topic)
        if tc is None:
            return None
        return {
            "orderTopicConf": None,
            "queueDatas": [{"brokerName": b.config.broker_name, "readQueueNums": tc.read_queue_nums,
                            "writeQueueNums": tc.write_queue_nums, "perm": tc.perm,
                            "topicSysFlag": tc.topic_sys_flag}],
            "brokerDatas": [{"cluster": b.config.broker_cluster_name, "brokerName": b.config.broker_name,
                             "brokerAddrs": {str(MASTER_ID): b.broker_addr}}],
            "filterServerTable": {},
        }

    def _route_info_by_topic(self, req: RemotingCommand) -> RemotingCommand:
        topic = req.get_str("topic")
        route = self.route_data(topic)
        if route is None:
            return req.response(ResponseCode.TOPIC_NOT_EXIST,
                                f"No topic route info in name server for the topic: {topic}")
        return req.response(body=json.dumps(route, separators=(",", ":")).encode())

    def _delete_topic(self, req: RemotingCommand) -> RemotingCommand:
        """DELETE_TOPIC_IN_NAMESRV: routes are answered from the broker's topic configs, so a topic deleted in
        the broker (DELETE_TOPIC_IN_BROKER) has no route already; like RocketMQ's name server this answers
        success whether or not the topic had one."""
        req.get_str("topic")
        return req.response()

    def _all_topic_list(self, req: RemotingCommand) -> RemotingCommand:
        topics = [tc.topic_name for tc in self.broker.topic_manager.file.list()]
        return req.response(body=json.dumps({"topicList": topics, "brokerAddr": None}).encode())

    def _broker_cluster_info(self, req: RemotingCommand) -> RemotingCommand:
        c = self.broker.config
        body = {"brokerAddrTable": {c.broker_name: {"cluster": c.broker_cluster_name, "brokerName": c.broker_name,
                                                    "brokerAddrs": {str(MASTER_ID): self.broker.broker_addr}}},
                "clusterAddrTable": {c.broker_cluster_name: [c.broker_name]}}
        return req.response(body=json.dumps(body).encode())
