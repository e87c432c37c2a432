"""Clients on RocketMQ's remoting protocol: `Producer`, `TransactionProducer`, `PullConsumer`, `Admin`.

Synchronous and thread-safe (a reader thread per connection matches responses by opaque), so they
work from Django views and Celery workers. They send only requests Apache RocketMQ understands, so
the same code can talk to a real RocketMQ name server and brokers.
"""

from ..common import Message, MessageExt
from .admin import Admin, ConsumeStats, QueueConsumeStats, QueueOffsets
from .base import TopicRoute
from .consumer import FOUND, NO_MATCHED_MSG, NO_NEW_MSG, OFFSET_ILLEGAL, PullConsumer, PullResult
from .pop_consumer import PopConsumer
from .producer import ConcurrencyError, ExtensionNotSupportedError, Producer, SendResult
from .remoting_client import MQBrokerError, RemotingError, RemotingTimeoutError
from .transaction_producer import TransactionProducer, TransactionSendResult, TransactionState

__all__ = [
    "ConcurrencyError", "ExtensionNotSupportedError", "FOUND", "NO_MATCHED_MSG", "NO_NEW_MSG", "OFFSET_ILLEGAL", "Admin", "MQBrokerError", "Message", "MessageExt",
    "ConsumeStats", "QueueConsumeStats", "QueueOffsets", "PopConsumer", "Producer", "PullConsumer", "PullResult", "RemotingError", "RemotingTimeoutError", "SendResult", "TopicRoute",
    "TransactionProducer", "TransactionSendResult", "TransactionState",
]
