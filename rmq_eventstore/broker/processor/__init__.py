"""Request processors, one module per request family as RocketMQ's broker has them; `Broker` routes
each request code to one processor through a single table (`Broker.register_processor`)."""

from __future__ import annotations

import json
from typing import Any, Protocol

from ...common.fastjson import ConfigFileError, fastjson_loads
from ...remoting import HeaderError, RemotingCommand
from ..long_polling import PullHold


class Processor(Protocol):
    """Serves the request codes it is registered for (`NettyRequestProcessor`)."""

    def process(self, request: RemotingCommand, channel: Any) -> RemotingCommand | PullHold:
        """The response, or a `PullHold` for a request the server must hold until an arrival."""


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
