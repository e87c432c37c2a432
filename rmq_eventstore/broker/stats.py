"""`BrokerStatsService`: what the broker's admin requests report about itself, and a short history of it.

A small thread owned by the broker samples every `stats_sample_interval` ms (5 s by default) the number of
messages put (the sum of every consume queue's max offset: it only grows), the commitlog's max offset, the
dispatch backlog and each consumer group's total lag, into a bounded ring buffer (`stats_history_size`
samples, 720 = one hour at 5 s). GET_BROKER_STATS_HISTORY (our extension) answers the buffer, so a
dashboard draws throughput and lag over time while the web processes hold no state. The put rates of
GET_BROKER_RUNTIME_INFO (`putTps`: over 10 s, 60 s and 600 s, as RocketMQ's `StoreStatsService`) come
from the same samples.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any

from ..store.cleanup import disk_partition_space_used_percent

if TYPE_CHECKING:
    from .broker import Broker

log = logging.getLogger(__name__)

TOPIC_GROUP_SEPARATOR = "@"


class BrokerStatsService:
    """Samples of the broker's counters in a ring buffer (see the module docstring); thread-safe."""

    def __init__(self, broker: Broker, interval_ms: int = 5000, capacity: int = 720) -> None:
        self.broker = broker
        self.interval = max(interval_ms, 50) / 1000.0
        self.capacity = max(capacity, 2)
        self._samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=self.capacity)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.boot_timestamp = int(time.time() * 1000)
        self._boot_put_total: int | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._boot_put_total = self.msg_put_total()
        self.sample()
        self._thread = threading.Thread(target=self._run, name="BrokerStatsService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception:  # a failed sample is a gap in the charts, never a dead thread
                log.exception("sampling the broker's statistics failed")

    # -- counters -------------------------------------------------------------------------------------
    def msg_put_total(self) -> int:
        """Messages ever put into this store's queues (half, delay and retry messages included)."""
        store = self.broker.store
        return sum(max(store.get_max_offset_in_queue(t, q), 0) for t in store.topics() for q in store.queue_ids(t))

    def group_lags(self) -> dict[str, int]:
        """group → messages behind over every queue it committed an offset on."""
        store = self.broker.store
        lags: dict[str, int] = {}
        for key, offsets in self.broker.offset_manager.file.offset_table().items():
            topic, sep, group = key.partition(TOPIC_GROUP_SEPARATOR)
            if not sep:
                continue
            lag = 0
            for queue_id, committed in offsets.items():
                lag += max(store.get_max_offset_in_queue(topic, queue_id) - max(committed, 0), 0)
            lags[group] = lags.get(group, 0) + lag
        return lags

    def sample(self) -> dict[str, Any]:
        """Take one sample now and keep it."""
        store = self.broker.store
        s = {"t": int(time.time() * 1000), "msgPutTotal": self.msg_put_total(),
             "commitLogMaxOffset": store.get_max_phy_offset(), "dispatchBehindBytes": store.dispatch_behind_bytes(),
             "groupLag": self.group_lags()}
        with self._lock:
            self._samples.append(s)
        return s

    def history(self, since_ms: int = 0) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(s) for s in self._samples if s["t"] > since_ms]

    def put_tps(self, seconds: int) -> float | None:
        """Messages per second over the last `seconds` (from the samples; None before there are two)."""
        with self._lock:
            samples = list(self._samples)
        if len(samples) < 2:
            return None
        last = samples[-1]
        first = next((s for s in samples if s["t"] >= last["t"] - seconds * 1000), samples[0])
        if first is last:
            first = samples[-2]
        dt = (last["t"] - first["t"]) / 1000.0
        return (last["msgPutTotal"] - first["msgPutTotal"]) / dt if dt > 0 else None

    # -- GET_BROKER_RUNTIME_INFO ----------------------------------------------------------------------
    def runtime_info(self) -> dict[str, str]:
        """The KVTable of GET_BROKER_RUNTIME_INFO: RocketMQ's key names where one exists (AdminBrokerProcessor
        `prepareRuntimeInfo`, DefaultMessageStore `getRuntimeInfo`), ours for the rest."""
        broker = self.broker
        store = broker.store
        sc = store.config
        put_total = self.msg_put_total()
        boot_total = self._boot_put_total if self._boot_put_total is not None else put_total
        commit_log_path = sc.commit_log_path
        ratio = disk_partition_space_used_percent(commit_log_path) if os.path.isdir(commit_log_path) else -1.0
        queue_ratio = disk_partition_space_used_percent(sc.store_path_root_dir)
        cp = store.checkpoint
        cleaner = store.clean_commit_log_service
        earliest = _earliest_message_time(store)
        tps = " ".join("" if v is None else f"{v:.4f}" for v in (self.put_tps(10), self.put_tps(60), self.put_tps(600)))
        info = {
            # RocketMQ's names
            "brokerVersionDesc": "rmq_eventstore (RocketMQ 5 protocol)",
            "brokerActive": "true",
            "bootTimestamp": str(self.boot_timestamp),
            "msgPutTotalTodayNow": str(put_total - boot_total),
            "commitLogMinOffset": str(store.get_min_phy_offset()),
            "commitLogMaxOffset": str(store.get_max_phy_offset()),
            "dispatchBehindBytes": str(store.dispatch_behind_bytes()),
            "commitLogDiskRatio": str(ratio),
            f"commitLogDiskRatio_{commit_log_path}": str(ratio),
            "consumeQueueDiskRatio": str(queue_ratio),
            "earliestMessageTimeStamp": str(earliest),
            "putTps": tps,
            # ours
            "msgPutTotal": str(put_total),
            "storePathRootDir": sc.store_path_root_dir,
            "storePathCommitLog": commit_log_path,
            "physicMsgTimestamp": str(cp.physic_msg_timestamp if cp is not None else 0),
            "logicsMsgTimestamp": str(cp.logics_msg_timestamp if cp is not None else 0),
            "indexMsgTimestamp": str(cp.index_msg_timestamp if cp is not None else 0),
            "diskMaxUsedSpaceRatio": str(sc.disk_max_used_space_ratio),
            "diskSpaceWarningLevelRatio": str(sc.disk_space_warning_level_ratio),
            "diskSpaceCleanForciblyRatio": str(sc.disk_space_clean_forcibly_ratio),
            "diskFull": str(store.running_flags.is_disk_full()).lower(),
            "topicCount": str(len(store.topics())),
            "consumerGroupCount": str(len(self.group_lags())),
            "statsSampleIntervalMillis": str(int(self.interval * 1000)),
        }
        if cleaner is not None:
            info["lastPhysicDiskRatio"] = str(getattr(cleaner, "last_physic_ratio", 0.0))
        return info


def _earliest_message_time(store: Any) -> int:
    """The store time of the oldest record still in the commitlog (-1 when there is none)."""
    try:
        m = store.look_message_by_offset(store.get_min_phy_offset())
    except Exception:
        m = None
    return int(m.store_timestamp) if m is not None else -1
