"""The RocketMQ storage engine in Python: commitlog, consume queues, index files, dispatch.

Byte-compatible with Apache RocketMQ 5.x (see `codec` for the record format).
"""

from ..common.codec import CorruptRecordError, DispatchRequest, EncodeError
from ..common.message import Message, MessageExt
from ..common.status import AppendMessageStatus, GetMessageStatus, PutMessageStatus
from .commitlog import AppendMessageResult, PutMessageResult
from .config import FlushDiskType, StoreConfig
from .mapped_file import StoreLoadError
from .message_store import (
    GetMessageResult,
    MessageFilter,
    MessageStore,
    QueryMessageResult,
    StoreLockedError,
    lock_holder,
)
from .reader import StoreReader

__all__ = [
    "AppendMessageResult", "AppendMessageStatus", "CorruptRecordError", "DispatchRequest", "EncodeError",
    "FlushDiskType", "GetMessageResult", "GetMessageStatus", "Message", "MessageExt", "MessageFilter",
    "MessageStore", "PutMessageResult", "PutMessageStatus", "QueryMessageResult", "StoreConfig",
    "StoreLoadError", "StoreLockedError", "StoreReader", "lock_holder",
]
