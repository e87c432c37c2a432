"""The broker's shape: one table from request code to the processor of its family, and the client
registry that heartbeats fill (consumers and producers by group, with their channels)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rmq_eventstore.broker import Broker
from rmq_eventstore.broker.processor.admin import AdminBrokerProcessor
from rmq_eventstore.broker.processor.client_manage import ClientManageProcessor
from rmq_eventstore.broker.processor.consumer_manage import ConsumerManageProcessor
from rmq_eventstore.broker.processor.end_transaction import EndTransactionProcessor
from rmq_eventstore.broker.processor.extension import ExtensionProcessor
from rmq_eventstore.broker.processor.namesrv import NameServerProcessor
from rmq_eventstore.broker.processor.pop import AckMessageProcessor, PopMessageProcessor
from rmq_eventstore.broker.processor.pull import PullMessageProcessor
from rmq_eventstore.broker.processor.query import QueryMessageProcessor
from rmq_eventstore.broker.processor.send import SendMessageProcessor
from rmq_eventstore.remoting import RemotingCommand, RequestCode, ResponseCode
from rmq_eventstore.store import MessageStore
from tests.conftest import SMALL_GEOMETRY

FAMILIES = {
    SendMessageProcessor: ("SEND_MESSAGE", "SEND_MESSAGE_V2", "SEND_BATCH_MESSAGE", "CONSUMER_SEND_MSG_BACK"),
    PullMessageProcessor: ("PULL_MESSAGE",),
    QueryMessageProcessor: ("QUERY_MESSAGE", "VIEW_MESSAGE_BY_ID"),
    ConsumerManageProcessor: ("QUERY_CONSUMER_OFFSET", "UPDATE_CONSUMER_OFFSET", "GET_CONSUMER_LIST_BY_GROUP",
                              "GET_MAX_OFFSET", "GET_MIN_OFFSET", "GET_EARLIEST_MSG_STORETIME",
                              "SEARCH_OFFSET_BY_TIMESTAMP"),
    ClientManageProcessor: ("HEART_BEAT", "UNREGISTER_CLIENT"),
    AdminBrokerProcessor: ("UPDATE_AND_CREATE_TOPIC", "GET_ALL_TOPIC_CONFIG", "GET_ALL_CONSUMER_OFFSET",
                           "GET_ALL_DELAY_OFFSET", "UPDATE_AND_CREATE_SUBSCRIPTIONGROUP",
                           "GET_ALL_SUBSCRIPTIONGROUP_CONFIG", "GET_BROKER_RUNTIME_INFO", "GET_TOPIC_STATS_INFO",
                           "GET_CONSUME_STATS", "DELETE_TOPIC_IN_BROKER"),
    EndTransactionProcessor: ("END_TRANSACTION",),
    ExtensionProcessor: ("GET_BROKER_EXTENSIONS", "QUERY_STREAM", "GET_BROKER_STATS_HISTORY", "QUERY_TRANSACTION_ENDS"),
    PopMessageProcessor: ("POP_MESSAGE",),
    AckMessageProcessor: ("ACK_MESSAGE", "BATCH_ACK_MESSAGE", "CHANGE_MESSAGE_INVISIBLETIME"),
}
NAMESRV = ("GET_ROUTEINFO_BY_TOPIC", "GET_ALL_TOPIC_LIST_FROM_NAMESERVER", "GET_BROKER_CLUSTER_INFO",
           "DELETE_TOPIC_IN_NAMESRV")


class FakeChannel:
    """A connection as the server hands it to the broker: an address and a one-way sender."""

    def __init__(self, address: str) -> None:
        self.remote_address = address
        self.sent: list[RemotingCommand] = []

    def send_oneway(self, command: RemotingCommand) -> None:
        self.sent.append(command)


@pytest.fixture
def broker(tmp_path: Path) -> Any:
    with MessageStore.open(tmp_path / "s", **SMALL_GEOMETRY) as store:
        b = Broker(store)
        b.start()
        try:
            yield b
        finally:
            b.shutdown()


def test_every_request_code_is_routed_to_the_processor_of_its_family(broker: Broker) -> None:
    served = set()
    for cls, names in FAMILIES.items():
        for name in names:
            processor = broker.processor_for(RequestCode[name])
            assert isinstance(processor, cls), name
            served.add(RequestCode[name])
    for name in NAMESRV:
        assert isinstance(broker._namesrv_processors[RequestCode[name]], NameServerProcessor)
    assert set(broker._processors) == served  # nothing registered that no family owns
    unknown = RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {})  # a client's code
    assert broker.process(unknown, None).code == ResponseCode.REQUEST_CODE_NOT_SUPPORTED


def test_a_registered_processor_serves_its_code(broker: Broker) -> None:
    class Echo:
        def process(self, request: RemotingCommand, channel: Any) -> RemotingCommand:
            return request.response(remark=f"echo {request.get_str('x')}")

    broker.register_processor(RequestCode.QUERY_BROKER_OFFSET, Echo())
    r = broker.process(RemotingCommand.request(RequestCode.QUERY_BROKER_OFFSET, {"x": "hi"}), None)
    assert r.code == ResponseCode.SUCCESS and r.remark == "echo hi"


def _heartbeat(client_id: str, producers: list[str], consumers: list[str]) -> RemotingCommand:
    body = {"clientID": client_id,
            "producerDataSet": [{"groupName": g} for g in producers],
            "consumerDataSet": [{"groupName": g, "consumeType": 0, "messageModel": 1,
                                 "subscriptionDataSet": [{"topic": "orders", "subString": "A || B"}]}
                                for g in consumers]}
    return RemotingCommand.request(RequestCode.HEART_BEAT, {}, body=json.dumps(body).encode())


def test_heartbeats_register_producers_by_group_with_their_channels(broker: Broker) -> None:
    web1, web2, other = FakeChannel("127.0.0.1:1"), FakeChannel("127.0.0.1:2"), FakeChannel("127.0.0.1:3")
    assert broker.process(_heartbeat("web-1", ["orders-app"], []), web1).code == ResponseCode.SUCCESS
    assert broker.process(_heartbeat("web-2", ["orders-app"], ["projector"]), web2).code == ResponseCode.SUCCESS
    assert broker.process(_heartbeat("batch", ["reports"], []), other).code == ResponseCode.SUCCESS
    producers = broker.client_manager.producers
    assert {i.client_id for i in producers.members("orders-app")} == {"web-1", "web-2"}
    assert {producers.available_channel("orders-app") for _ in range(50)} == {web1, web2}
    assert producers.available_channel("nobody") is None
    assert broker.client_manager.consumers.subscription("projector", "orders") == "A || B"
    # a closed connection takes its registrations with it; the rest of the group still answers
    broker.on_channel_closed(web1)
    assert {producers.available_channel("orders-app") for _ in range(20)} == {web2}
    unregister = RemotingCommand.request(RequestCode.UNREGISTER_CLIENT,
                                         {"clientID": "web-2", "producerGroup": "orders-app",
                                          "consumerGroup": "projector"})
    assert broker.process(unregister, web2).code == ResponseCode.SUCCESS
    assert producers.available_channel("orders-app") is None
    assert broker.consumer_ids("projector") == []
    assert producers.available_channel("reports") is other
