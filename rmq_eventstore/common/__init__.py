"""What every layer shares, as RocketMQ's `common` module: the message model, the record codec (the one
module that knows the commitlog bytes), message ids, properties and tags codes, topic and group name
rules, topic configs and permissions, status enums and the fastjson dialect. It imports nothing of the
store, the broker, the client or the command line, so a process that only talks to a broker never loads
the engine.
"""

from .codec import CorruptRecordError, DispatchRequest, EncodeError
from .message import Message, MessageExt
from .status import AppendMessageStatus, GetMessageStatus, PutMessageStatus

__all__ = [
    "AppendMessageStatus", "CorruptRecordError", "DispatchRequest", "EncodeError", "GetMessageStatus",
    "Message", "MessageExt", "PutMessageStatus",
]
