"""`StoreConfig`: RocketMQ's `MessageStoreConfig` in snake_case, with RocketMQ's defaults (spec §16)."""

from __future__ import annotations

import dataclasses
import enum
import os
from dataclasses import dataclass, field

from ..common.delay import DEFAULT_DELAY_LEVELS_MS, DEFAULT_MESSAGE_DELAY_LEVEL, parse_delay_levels

__all__ = [
    "CQ_STORE_UNIT_SIZE",
    "DEFAULT_DELAY_LEVELS_MS",
    "DEFAULT_MESSAGE_DELAY_LEVEL",
    "FlushDiskType",
    "StoreConfig",
    "parse_delay_levels",
]


class FlushDiskType(enum.Enum):
    """When a put counts as durable: after an fsync of its bytes (SYNC) or in the background (ASYNC)."""

    SYNC_FLUSH = "SYNC_FLUSH"
    ASYNC_FLUSH = "ASYNC_FLUSH"


CQ_STORE_UNIT_SIZE = 20


@dataclass
class StoreConfig:
    """Configuration of one store directory; field names follow RocketMQ's `MessageStoreConfig`.

    Sizes default to RocketMQ's (1 GiB commitlog files, 300 000-unit consume queue files, 5 M slot /
    20 M entry index files) so that a store we write opens in Apache RocketMQ and vice versa; tests and
    small deployments shrink them.
    """

    store_path_root_dir: str = field(default_factory=lambda: os.path.join(os.path.expanduser("~"), "store"))
    store_path_commit_log: str | None = None  # default <root>/commitlog
    mapped_file_size_commit_log: int = 1024 * 1024 * 1024
    mapped_file_size_consume_queue: int = 300_000 * CQ_STORE_UNIT_SIZE
    max_hash_slot_num: int = 5_000_000
    max_index_num: int = 5_000_000 * 4
    # timer messages (MessageStoreConfig's timer* names and defaults)
    timer_wheel_enable: bool = True
    timer_precision_ms: int = 1000
    timer_max_delay_sec: int = 259_200
    timer_flush_interval_ms: int = 1000
    mapped_file_size_timer_log: int = 100 * 1024 * 1024
    max_msgs_num_batch: int = 64
    message_index_enable: bool = True
    message_index_safe: bool = False
    max_message_size: int = 1024 * 1024 * 4
    auto_message_version_on_topic_len: bool = True
    enabled_append_prop_crc: bool = False
    force_verify_prop_crc: bool = False
    check_crc_on_recover: bool = True
    # Flush (spec §5.4, §11)
    flush_disk_type: FlushDiskType = FlushDiskType.ASYNC_FLUSH
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    flush_commit_log_timed: bool = True
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    sync_flush_timeout: int = 5000
    commit_interval_commit_log: int = 200
    commit_commit_log_least_pages: int = 4
    commit_commit_log_thorough_interval: int = 200
    transient_store_pool_enable: bool = False
    transient_store_pool_size: int = 5
    warm_mapped_file_enable: bool = False
    # ours: the flush service faults in the commitlog's pages this far ahead of the writer (MappedFile.warm),
    # so that a put does not fault a fresh page in inside the put lock; 0: off
    warm_ahead_bytes: int = 4 << 20
    os_page_cache_busy_timeout_mills: int = 1000
    # Cleanup (spec §5.8)
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    disk_space_warning_level_ratio: int = 90
    disk_space_clean_forcibly_ratio: int = 85
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_mapped_file_interval_forcibly: int = 120_000
    delete_file_batch_max: int = 10
    # Reads (spec §12.2)
    access_message_in_memory_max_ratio: int = 40
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_disk: int = 64 * 1024
    max_transfer_count_on_message_in_disk: int = 8
    max_filter_message_size: int = 16_000
    travel_cq_file_num_when_get_message: int = 1
    default_query_max_num: int = 32
    message_delay_level: str = DEFAULT_MESSAGE_DELAY_LEVEL
    duplication_enable: bool = False
    # Broker-side identity written into every record (BrokerConfig.brokerIP1 + listenPort in RocketMQ).
    store_host: str = "127.0.0.1:10911"
    # Our embedded store plays the broker's part too: like SendMessageProcessor, give every message a
    # UNIQ_KEY (client message id) when the producer sent none, so it can be found by id.
    auto_create_uniq_key: bool = True

    def __post_init__(self) -> None:
        if self.mapped_file_size_commit_log < 64:
            raise ValueError("mapped_file_size_commit_log must be at least 64 bytes")
        # RocketMQ's getter rounds the consume queue file size up to a multiple of the unit size.
        unit = CQ_STORE_UNIT_SIZE
        self.mapped_file_size_consume_queue = -(-self.mapped_file_size_consume_queue // unit) * unit
        if isinstance(self.flush_disk_type, str):
            self.flush_disk_type = FlushDiskType(self.flush_disk_type)
        if self.max_hash_slot_num <= 0 or self.max_index_num <= 1:
            raise ValueError("max_hash_slot_num must be > 0 and max_index_num > 1")
        if not isinstance(self.warm_ahead_bytes, int) or self.warm_ahead_bytes < 0:
            raise ValueError(f"warm_ahead_bytes must be an int >= 0 (0: off), not {self.warm_ahead_bytes!r}")

    # Paths (StorePathConfigHelper)
    @property
    def commit_log_path(self) -> str:
        return self.store_path_commit_log or os.path.join(self.store_path_root_dir, "commitlog")

    @property
    def consume_queue_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "consumequeue")

    @property
    def index_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "index")

    @property
    def checkpoint_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "checkpoint")

    @property
    def abort_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "abort")

    @property
    def lock_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "lock")

    @property
    def config_path(self) -> str:
        return os.path.join(self.store_path_root_dir, "config")

    def replace(self, **changes: object) -> StoreConfig:
        """A copy with some fields changed."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> set[str]:
        return {f.name for f in dataclasses.fields(cls)}
