"""RocketMQ's remoting protocol as a pure codec: frames, `RemotingCommand`, request/response codes and
header field names. No sockets and no policy here (the broker and client bring those)."""

from .codes import (
    CLIENT_VERSION,
    FLAG_ONEWAY,
    FLAG_RESPONSE,
    PULL_FLAG_CLASS_FILTER,
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    LanguageCode,
    RequestCode,
    ResponseCode,
    SerializeType,
)
from .command import (
    DEFAULT_MAX_FRAME_SIZE,
    DEFAULT_MAX_HEADER_SIZE,
    FrameDecoder,
    FrameError,
    HeaderError,
    RemotingCommand,
    decode_frame,
    loads_text,
    next_opaque,
)
from .headers import SEND_V2_SHORT_NAMES, send_header_v1, send_header_v2

__all__ = [
    "CLIENT_VERSION", "DEFAULT_MAX_FRAME_SIZE", "DEFAULT_MAX_HEADER_SIZE", "FLAG_ONEWAY", "FLAG_RESPONSE",
    "PULL_FLAG_CLASS_FILTER", "PULL_FLAG_COMMIT_OFFSET", "PULL_FLAG_SUBSCRIPTION", "PULL_FLAG_SUSPEND",
    "SEND_V2_SHORT_NAMES", "FrameDecoder", "FrameError", "HeaderError", "LanguageCode", "RemotingCommand",
    "RequestCode", "ResponseCode", "SerializeType", "decode_frame", "loads_text", "next_opaque", "send_header_v1",
    "send_header_v2",
]
