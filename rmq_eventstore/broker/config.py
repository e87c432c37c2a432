"""`BrokerConfig`: RocketMQ's `BrokerConfig` settings in snake_case with RocketMQ's defaults, and the
broker-wide constants."""

from __future__ import annotations

from dataclasses import dataclass

MASTER_ID = 0
DLQ_NUMS_PER_GROUP = 1
MAX_GROUPS_PER_HEARTBEAT = 256  # each new group is a config-file write; a real client names a handful


@dataclass
class BrokerConfig:
    """Broker settings (`BrokerConfig` names in snake_case, RocketMQ's defaults)."""

    broker_name: str = "broker-a"
    broker_cluster_name: str = "DefaultCluster"
    broker_id: int = MASTER_ID
    # brokerIP1: the address the broker registers with the name server and stamps on its records as their
    # store host (with the listen port), when clients must reach it by another address than the one it
    # listens on (NAT, a container, a TCP proxy). None: the listen address.
    broker_ip1: str | None = None
    auto_create_topic_enable: bool = True
    default_topic_queue_nums: int = 4
    auto_create_subscription_group: bool = True
    long_polling_enable: bool = True
    short_polling_time_mills: int = 1000
    max_suspend_timeout_mills: int = 5 * 60 * 1000  # a hostile suspend timeout cannot hold a pull for days
    flush_consumer_offset_interval: int = 5000
    channel_expired_timeout: int = 120_000
    default_query_max_num: int = 32
    max_pull_msg_nums: int = 1024
    message_delay_level: str | None = None  # None: the store's message_delay_level
    # transactional (half) messages: BrokerConfig's transactionTimeOut, transactionCheckMax,
    # transactionCheckInterval
    transaction_timeout: int = 6_000  # a half message with no end is checked back after this many ms
    transaction_check_max: int = 15  # check-backs before a half message is discarded to TRANS_CHECK_MAX_TIME_TOPIC
    transaction_check_interval: int = 30_000  # ms between two walks of the half queue
    reject_transaction_message: bool = False
    # access control (RocketMQ's aclEnable; the plain_acl.yml path is ours: default <store>/config/plain_acl.yml)
    acl_enable: bool = False
    acl_file: str | None = None
    # POP's checkpoint buffer (RocketMQ's enablePopBufferMerge, popCkStayBufferTime, popCkStayBufferTimeOut,
    # popCkMaxBufferSize; pop_buffer.py): a checkpoint stays in memory up to the stay time (ms), and is written at
    # the latest the time-out before its revive time (ours 500 ms: our revive service runs every 100 ms, not 1 s)
    enable_pop_buffer_merge: bool = True
    pop_ck_stay_buffer_time: int = 10_000
    pop_ck_stay_buffer_time_out: int = 500
    pop_ck_max_buffer_size: int = 200_000
    # POP long polls held at once (RocketMQ's popPollingSize, maxPopPollingSize): per topic, group and queue id, and
    # in all; a POP that finds nothing past either answers POLLING_FULL at once (our client then waits out a second)
    pop_polling_size: int = 1024
    max_pop_polling_size: int = 100_000
    # the statistics history (ours, GET_BROKER_STATS_HISTORY): one sample every interval (ms), this many kept
    stats_sample_interval: int = 5000
    stats_history_size: int = 720

    @classmethod
    def field_names(cls) -> set[str]:
        return set(cls.__dataclass_fields__)
