"""Clients announcing themselves (`ClientManageProcessor`): HEART_BEAT registers consumers (with their
subscriptions) and producers by group; UNREGISTER_CLIENT removes them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from ...common.topic import is_valid_group
from ...remoting import HeaderError, RemotingCommand, RequestCode
from ..client_manager import ClientInfo
from ..config import MAX_GROUPS_PER_HEARTBEAT
from . import parse_json_body

if TYPE_CHECKING:
    from ..broker import Broker

_CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY", 2: "CONSUME_POP"}
_MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}


def _enum_name(value: Any, table: dict[int, str]) -> str:
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int):
        return table.get(value, str(value))
    return str(value) if value is not None else ""


class ClientManageProcessor:
    """HEART_BEAT and UNREGISTER_CLIENT."""

    CODES = (RequestCode.HEART_BEAT, RequestCode.UNREGISTER_CLIENT)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        if req.code == RequestCode.HEART_BEAT:
            return self._heart_beat(req, channel)
        return self._unregister_client(req)

    def _heart_beat(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        data = parse_json_body(req.body, "heartbeat")
        if not isinstance(data, dict):
            raise HeaderError("heartbeat body is not a JSON object")
        client_id = str(data.get("clientID") or "")
        if not client_id:
            raise HeaderError("heartbeat without clientID")
        now = time.monotonic()
        consumers = data.get("consumerDataSet") or []
        producers = data.get("producerDataSet") or []
        if not isinstance(consumers, list) or not isinstance(producers, list):
            raise HeaderError("heartbeat consumerDataSet / producerDataSet must be lists")
        if len(consumers) + len(producers) > MAX_GROUPS_PER_HEARTBEAT:
            raise HeaderError(f"heartbeat names more than {MAX_GROUPS_PER_HEARTBEAT} groups")
        registry = self.broker.client_manager
        changed_groups = []
        for cd in consumers:
            if not isinstance(cd, dict) or not isinstance(cd.get("groupName"), str):
                continue
            group = cd["groupName"]
            if not is_valid_group(group) or self.broker.group_manager.find(group) is None:
                continue
            subs: dict[str, str] = {}
            for sd in cd.get("subscriptionDataSet") or []:
                if isinstance(sd, dict) and isinstance(sd.get("topic"), str):
                    subs[sd["topic"]] = str(sd.get("subString") or "*")
            info = ClientInfo(client_id, channel, req.language, req.version, now, subs,
                              _enum_name(cd.get("consumeType"), _CONSUME_TYPES),
                              _enum_name(cd.get("messageModel"), _MESSAGE_MODELS))
            if registry.consumers.register(group, info):
                changed_groups.append(group)
            self.broker.topic_manager.create_retry_topic(group)
        for pd in producers:
            if isinstance(pd, dict) and isinstance(pd.get("groupName"), str):
                registry.producers.register(pd["groupName"],
                                            ClientInfo(client_id, channel, req.language, req.version, now))
        for group in changed_groups:
            registry.consumers.notify_consumer_ids_changed(group)
        return req.response()

    def _unregister_client(self, req: RemotingCommand) -> RemotingCommand:
        client_id = req.get_str("clientID")
        pg = req.get_str("producerGroup", None)
        cg = req.get_str("consumerGroup", None)
        registry = self.broker.client_manager
        if pg:
            registry.producers.unregister(pg, client_id)
        if cg and registry.consumers.unregister(cg, client_id):
            registry.consumers.notify_consumer_ids_changed(cg)
        return req.response()
