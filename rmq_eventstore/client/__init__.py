"""Clients on RocketMQ's remoting protocol: `Producer`, `TransactionProducer`, `PullConsumer`, `Admin`.

Synchronous and thread-safe (a reader thread per connection matches responses by opaque), so they
work from Django views and Celery workers. They send only requests Apache RocketMQ understands, so
the same code can talk to a real RocketMQ name server and brokers.

`resolve_namesrv("file:///srv/var/store")` (module `local`) finds the broker process that owns a local
store, or starts one, and returns its name-server address for these clients.
"""

from ..common import Message, MessageExt
from .admin import Admin, ConsumeStats, QueueConsumeStats, QueueOffsets
from .base import TopicRoute
from .cluster_consumer import ClusterConsumer, allocate_averagely
from .consumer import FOUND, NO_MATCHED_MSG, NO_NEW_MSG, OFFSET_ILLEGAL, PullConsumer, PullResult
from .local import (
    LocalBroker,
    LocalBrokerError,
    ensure_local_broker,
    find_local_broker,
    parse_url,
    resolve_namesrv,
    stop_local_broker,
)
from .pop_consumer import PopConsumer
from .producer import ConcurrencyError, ExtensionNotSupportedError, Producer, SendResult
from .remoting_client import MQBrokerError, RemotingError, RemotingTimeoutError
from .transaction_producer import TransactionProducer, TransactionSendResult, TransactionState

__all__ = [
    "ClusterConsumer", "allocate_averagely", "ConcurrencyError", "ExtensionNotSupportedError", "FOUND", "LocalBroker",
    "LocalBrokerError", "NO_MATCHED_MSG", "NO_NEW_MSG", "OFFSET_ILLEGAL", "Admin", "MQBrokerError", "Message", "MessageExt",
    "ConsumeStats", "QueueConsumeStats", "QueueOffsets", "PopConsumer", "Producer", "PullConsumer", "PullResult",
    "RemotingError", "RemotingTimeoutError", "SendResult", "TopicRoute", "TransactionProducer", "TransactionSendResult",
    "TransactionState", "ensure_local_broker", "find_local_broker", "parse_url", "resolve_namesrv", "stop_local_broker",
]
