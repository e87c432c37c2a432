"""Header (extFields) names of the requests this package sends and serves, as in RocketMQ's
`*RequestHeader` / `*ResponseHeader` classes, and the short names of `SEND_MESSAGE_V2`."""

from __future__ import annotations

# SendMessageRequestHeaderV2 uses one-letter names to keep fastjson fast; the V1 names they stand for.
SEND_V2_SHORT_NAMES: dict[str, str] = {
    "a": "producerGroup",
    "b": "topic",
    "c": "defaultTopic",
    "d": "defaultTopicQueueNums",
    "e": "queueId",
    "f": "sysFlag",
    "g": "bornTimestamp",
    "h": "flag",
    "i": "properties",
    "j": "reconsumeTimes",
    "k": "unitMode",
    "l": "maxReconsumeTimes",
    "m": "batch",
    "n": "brokerName",
}
SEND_V1_TO_V2: dict[str, str] = {v: k for k, v in SEND_V2_SHORT_NAMES.items()}


def send_header_v1(ext: dict[str, str]) -> dict[str, str]:
    """The V1 (`SendMessageRequestHeader`) view of a SEND_MESSAGE_V2 header (`createSendMessageRequestHeaderV1`)."""
    return {SEND_V2_SHORT_NAMES.get(k, k): v for k, v in ext.items()}


def send_header_v2(ext: dict[str, str]) -> dict[str, str]:
    """The short-named V2 form of a V1 send header (`createSendMessageRequestHeaderV2`)."""
    return {SEND_V1_TO_V2.get(k, k): v for k, v in ext.items()}


# Field names used across requests.
TOPIC = "topic"
QUEUE_ID = "queueId"
CONSUMER_GROUP = "consumerGroup"
QUEUE_OFFSET = "queueOffset"
MAX_MSG_NUMS = "maxMsgNums"
SYS_FLAG = "sysFlag"
COMMIT_OFFSET = "commitOffset"
SUSPEND_TIMEOUT_MILLIS = "suspendTimeoutMillis"
SUBSCRIPTION = "subscription"
SUB_VERSION = "subVersion"
EXPRESSION_TYPE = "expressionType"
NEXT_BEGIN_OFFSET = "nextBeginOffset"
MIN_OFFSET = "minOffset"
MAX_OFFSET = "maxOffset"
SUGGEST_WHICH_BROKER_ID = "suggestWhichBrokerId"
OFFSET = "offset"
MSG_ID = "msgId"
TIMESTAMP = "timestamp"
KEY = "key"
MAX_NUM = "maxNum"
BEGIN_TIMESTAMP = "beginTimestamp"
END_TIMESTAMP = "endTimestamp"
INDEX_LAST_UPDATE_TIMESTAMP = "indexLastUpdateTimestamp"
INDEX_LAST_UPDATE_PHYOFFSET = "indexLastUpdatePhyoffset"
CLIENT_ID = "clientID"
PRODUCER_GROUP = "producerGroup"
GROUP = "group"
DELAY_LEVEL = "delayLevel"
ORIGIN_MSG_ID = "originMsgId"
ORIGIN_TOPIC = "originTopic"
MAX_RECONSUME_TIMES = "maxReconsumeTimes"
