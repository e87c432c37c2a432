"""What this broker serves beyond Apache RocketMQ (GET_BROKER_EXTENSIONS, our request code 4400).

Clients ask before using an extension: an Apache RocketMQ broker answers REQUEST_CODE_NOT_SUPPORTED, and
since it ignores header fields it does not know, a client that skipped the question would have its
expected-version append stored unchecked. The answer is a JSON object of feature names."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ...remoting import RemotingCommand, RequestCode

if TYPE_CHECKING:
    from ..broker import Broker

EXTENSIONS = {"expectedVersionAppend": 1}


class ExtensionProcessor:
    """GET_BROKER_EXTENSIONS."""

    CODES = (RequestCode.GET_BROKER_EXTENSIONS,)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def process(self, req: RemotingCommand, channel: Any) -> RemotingCommand:
        return req.response(body=json.dumps({"broker": "rmq_eventstore", "extensions": EXTENSIONS}).encode())
