"""The RocketMQ storage engine in Python: commitlog, consume queues, index files, dispatch.

Byte-compatible with Apache RocketMQ 5.x (see `codec` for the record format).
"""

from .codec import DispatchRequest, EncodeError, CorruptRecordError
from .config import FlushDiskType, StoreConfig
from .message import Message, MessageExt
from .status import AppendMessageStatus, GetMessageStatus, PutMessageStatus

__all__ = [
    "AppendMessageStatus", "CorruptRecordError", "DispatchRequest", "EncodeError", "FlushDiskType",
    "GetMessageStatus", "Message", "MessageExt", "PutMessageStatus", "StoreConfig",
]
