"""Request, response, language and serialization codes of RocketMQ's remoting protocol.

Values are those of Apache RocketMQ's `RequestCode`, `ResponseCode`, `LanguageCode` and
`SerializeType` (remoting module); names keep RocketMQ's spelling (GET_ROUTEINFO_BY_TOPIC included).
"""

from __future__ import annotations

import enum


class RequestCode(enum.IntEnum):
    """`RequestCode`: what a request asks for (only the codes this package sends or serves)."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_BROKER_OFFSET = 13
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    END_TRANSACTION = 37
    CHECK_TRANSACTION_STATE = 39
    GET_CONSUMER_LIST_BY_GROUP = 38
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    GET_ALL_CONSUMER_OFFSET = 43
    GET_ALL_DELAY_OFFSET = 45
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
    GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
    GET_TOPIC_STATS_INFO = 202
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    DELETE_TOPIC_IN_BROKER = 215
    DELETE_TOPIC_IN_NAMESRV = 216
    GET_CONSUME_STATS = 208
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320
    POP_MESSAGE = 200050
    ACK_MESSAGE = 200051
    CHANGE_MESSAGE_INVISIBLETIME = 200053
    BATCH_ACK_MESSAGE = 200151
    # our extension (outside RocketMQ's ranges): which rmq_eventstore features a broker serves
    GET_BROKER_EXTENSIONS = 4400
    # our extension: a stream's events in version order (index lookup without RocketMQ's 64-message cap)
    QUERY_STREAM = 4401
    # our extension: the broker's sampled counters over the last hour (dashboards' charts)
    GET_BROKER_STATS_HISTORY = 4402
    # our extension: how the broker ended transactions (by id), for the Django face's marker cleanup
    QUERY_TRANSACTION_ENDS = 4403


class ResponseCode(enum.IntEnum):
    """`ResponseCode` (with the `RemotingSysResponseCode` values 0-3)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    TRANSACTION_FAILED = 4
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    VERSION_NOT_SUPPORTED = 15
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    TOPIC_EXIST_ALREADY = 18
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    INVALID_PARAMETER = 29
    TRANSACTION_SHOULD_COMMIT = 200
    TRANSACTION_SHOULD_ROLLBACK = 201
    TRANSACTION_STATE_UNKNOW = 202
    TRANSACTION_STATE_GROUP_WRONG = 203
    NO_MESSAGE = 208
    POLLING_FULL = 209
    POLLING_TIMEOUT = 210
    ILLEGAL_OPERATION = 604
    # our extension: an expected-version append found another version (nothing was stored)
    STREAM_VERSION_CONFLICT = 4409


class LanguageCode(enum.IntEnum):
    """`LanguageCode`: the `language` a peer announces (JSON headers carry the name)."""

    JAVA = 0
    CPP = 1
    DOTNET = 2
    PYTHON = 3
    DELPHI = 4
    ERLANG = 5
    RUBY = 6
    OTHER = 7
    HTTP = 8
    GO = 9
    PHP = 10
    OMS = 11
    RUST = 12
    NODE_JS = 13


class SerializeType(enum.IntEnum):
    """`SerializeType`: the high byte of the header-length word."""

    JSON = 0
    ROCKETMQ = 1


# RemotingCommand flag bits (RPC_TYPE = 0 request / 1 response, RPC_ONEWAY = 1).
FLAG_RESPONSE = 0x1
FLAG_ONEWAY = 0x2

# PullSysFlag bits of PULL_MESSAGE's sysFlag.
PULL_FLAG_COMMIT_OFFSET = 0x1
PULL_FLAG_SUSPEND = 0x2
PULL_FLAG_SUBSCRIPTION = 0x4
PULL_FLAG_CLASS_FILTER = 0x8

# The version a RocketMQ 4.9.x Java client announces (MQVersion.Version.V4_9_4); ours says the same.
CLIENT_VERSION = 435
