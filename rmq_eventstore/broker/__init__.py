"""The broker: a `Broker` object over a `MessageStore` (embedded use) and an asyncio server that exposes
it over RocketMQ's remoting protocol, together with a single-broker name server."""

from ..common.delay import parse_delay_levels
from .broker import Broker
from .config import BrokerConfig
from .long_polling import PullHold, PullRequestHoldService
from .schedule import ScheduleMessageService
from .server import BrokerServer, RunningBroker, serve_in_thread

__all__ = [
    "Broker", "BrokerConfig", "BrokerServer", "PullHold", "PullRequestHoldService", "RunningBroker",
    "ScheduleMessageService", "parse_delay_levels", "serve_in_thread",
]
