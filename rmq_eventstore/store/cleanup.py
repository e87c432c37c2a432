"""File cleanup and disk watermarks (spec §5.8): `CleanCommitLogService`, `CleanConsumeQueueService`.

Commitlog files older than `fileReservedTime` hours are deleted at the `deleteWhen` hours, or at once when
the disk is fuller than `diskSpaceCleanForciblyRatio`; consume queue and index files follow the commitlog's
minimum offset. Above `diskSpaceWarningLevelRatio` the store is marked DISK_FULL (`RunningFlags`): puts get
SERVICE_NOT_AVAILABLE, reads keep working, and the flag clears by itself once usage falls to the
clean-forcibly level again (the next cleanup round re-checks; no restart, unlike RocketMQ #331).

The disk usage probe is a plain function on the service (`disk_usage(path) -> ratio`), so tests and
operators can substitute it; everything else (files, deletion, puts) is real.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .flush import ServiceThread

if TYPE_CHECKING:
    from .commitlog import CommitLog
    from .config import StoreConfig
    from .consume_queue import ConsumeQueue
    from .index import IndexService

log = logging.getLogger(__name__)

MAX_MANUAL_DELETE_FILE_TIMES = 20
CLEAN_INITIAL_DELAY_MS = 60_000  # RocketMQ schedules the first cleanup one minute after start


def disk_partition_space_used_percent(path: str) -> float:
    """`UtilAll.getDiskPartitionSpaceUsedPercent`: used/(used+usable) of `path`'s filesystem, rounded up to
    a whole percent and returned as a ratio in [0, 1]; -1 when it cannot be read."""
    try:
        while not os.path.exists(path):  # the store directory may not exist yet: ask its parent
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
        st = os.statvfs(path)
    except OSError as e:
        log.error("cannot read the disk usage of %s: %s", path, e)
        return -1.0
    total = st.f_blocks * st.f_frsize
    free = st.f_bfree * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    used = total - free
    if used + usable <= 0:
        return -1.0
    return math.ceil(used * 100 / (used + usable)) / 100.0


def is_it_time_to_do(when: str, hour: int) -> bool:
    """`UtilAll.isItTimeToDo`: whether `hour` is one of the `;`-separated hours in `when` (e.g. "04;16")."""
    for part in when.split(";"):
        part = part.strip()
        if part and part.isdigit() and int(part) == hour:
            return True
    return False


class RunningFlags:
    """The store's state bits (`RunningFlags`); the store takes puts only while none of the write bits is set."""

    NOT_READABLE_BIT = 1
    NOT_WRITEABLE_BIT = 1 << 1
    WRITE_LOGICS_QUEUE_ERROR_BIT = 1 << 2
    WRITE_INDEX_FILE_ERROR_BIT = 1 << 3
    DISK_FULL_BIT = 1 << 4
    _WRITE_BITS = NOT_WRITEABLE_BIT | WRITE_LOGICS_QUEUE_ERROR_BIT | DISK_FULL_BIT | WRITE_INDEX_FILE_ERROR_BIT

    def __init__(self) -> None:
        self.flag_bits = 0
        self._lock = threading.Lock()
        self.disk_full_reason = ""

    def is_writeable(self) -> bool:
        return (self.flag_bits & self._WRITE_BITS) == 0

    def is_readable(self) -> bool:
        return (self.flag_bits & self.NOT_READABLE_BIT) == 0

    def is_disk_full(self) -> bool:
        return bool(self.flag_bits & self.DISK_FULL_BIT)

    def get_and_make_disk_full(self, reason: str = "") -> bool:
        """Set DISK_FULL; True when the disk was OK before (`getAndMakeDiskFull`)."""
        with self._lock:
            ok = not self.flag_bits & self.DISK_FULL_BIT
            self.flag_bits |= self.DISK_FULL_BIT
            self.disk_full_reason = reason
            return ok

    def get_and_make_disk_ok(self) -> bool:
        """Clear DISK_FULL; True when it was already clear (`getAndMakeDiskOK`)."""
        with self._lock:
            ok = not self.flag_bits & self.DISK_FULL_BIT
            self.flag_bits &= ~self.DISK_FULL_BIT
            self.disk_full_reason = ""
            return ok

    def why_not_writeable(self) -> str:
        bits = self.flag_bits
        reasons = []
        if bits & self.DISK_FULL_BIT:
            reasons.append(f"the disk is full ({self.disk_full_reason})" if self.disk_full_reason
                           else "the disk is full")
        if bits & self.NOT_WRITEABLE_BIT:
            reasons.append("the store was made read-only")
        if bits & self.WRITE_LOGICS_QUEUE_ERROR_BIT:
            reasons.append("writing a consume queue failed")
        if bits & self.WRITE_INDEX_FILE_ERROR_BIT:
            reasons.append("writing an index file failed")
        return "; ".join(reasons)


def _clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


class CleanCommitLogService:
    """Deletes expired commitlog files and watches the disk (`DefaultMessageStore.CleanCommitLogService`).

    `run(now_ms)` is one round: it decides from the hour (`deleteWhen`), the disk usage and manual requests
    whether to delete, and deletes at most `deleteFileBatchMax` files, never the last one.
    """

    def __init__(self, config: StoreConfig, commit_log: CommitLog, running_flags: RunningFlags,
                 disk_usage: Callable[[str], float] = disk_partition_space_used_percent) -> None:
        self.config = config
        self.commit_log = commit_log
        self.running_flags = running_flags
        self.disk_usage = disk_usage
        self.clean_immediately = False
        self.manual_delete_file_several_times = 0
        self.last_physic_ratio = 0.0
        self.deleted_files = 0

    # thresholds, clamped as RocketMQ's getters clamp them
    @property
    def disk_space_warning_level_ratio(self) -> float:
        return _clamp(self.config.disk_space_warning_level_ratio / 100.0, 0.35, 0.90)

    @property
    def disk_space_clean_forcibly_ratio(self) -> float:
        return _clamp(self.config.disk_space_clean_forcibly_ratio / 100.0, 0.30, 0.85)

    @property
    def disk_max_used_space_ratio(self) -> float:
        return _clamp(self.config.disk_max_used_space_ratio, 10, 95) / 100.0

    def execute_delete_files_manually(self) -> None:
        """`executeDeleteFilesManually`: the next 20 rounds delete expired files whatever the hour."""
        self.manual_delete_file_several_times = MAX_MANUAL_DELETE_FILE_TIMES
        log.info("executeDeleteFilesManually was invoked")

    def is_time_to_delete(self, now_ms: int | None = None) -> bool:
        now = time.time() if now_ms is None else now_ms / 1000.0
        return is_it_time_to_do(self.config.delete_when, time.localtime(now).tm_hour)

    def _check_path(self, path: str, what: str) -> bool | None:
        """The watermark rules for one partition; True/False decides, None means 'look further'."""
        ratio = self.disk_usage(path)
        if what == "physic":
            self.last_physic_ratio = ratio
        warning = self.disk_space_warning_level_ratio
        forcibly = self.disk_space_clean_forcibly_ratio
        if ratio > warning:
            reason = (f"{what} disk usage {ratio:.0%} of {path} is above diskSpaceWarningLevelRatio "
                      f"{warning:.0%}")
            if self.running_flags.get_and_make_disk_full(reason):
                log.error("%s disk maybe full soon %.2f, so mark disk full", what, ratio)
            self.clean_immediately = True
            return True
        if ratio > forcibly:
            self.clean_immediately = True
            return True
        if not self.running_flags.get_and_make_disk_ok():
            log.info("%s disk space OK %.2f, so mark disk ok", what, ratio)
        if ratio < 0 or ratio > self.disk_max_used_space_ratio:
            log.info("%s disk maybe full soon, so reclaim space, %.2f", what, ratio)
            return True
        return None

    def is_space_to_delete(self) -> bool:
        """`isSpaceToDelete`: the disk watermarks of the commitlog and consume queue partitions."""
        self.clean_immediately = False
        r = self._check_path(self.config.commit_log_path, "physic")
        if r is not None:
            return r
        r = self._check_path(self.config.consume_queue_path, "logics")
        return bool(r)

    def run(self, now_ms: int | None = None) -> int:
        """One round (`deleteExpiredFiles`); returns how many commitlog files were deleted."""
        cfg = self.config
        timeup = self.is_time_to_delete(now_ms)
        spacefull = self.is_space_to_delete()
        manual = self.manual_delete_file_several_times > 0
        if not (timeup or spacefull or manual):
            return 0
        if manual:
            self.manual_delete_file_several_times -= 1
        clean_at_once = cfg.clean_file_forcibly_enable and self.clean_immediately
        log.info("begin to delete expired commitlog files: timeup=%s spacefull=%s manual=%s cleanAtOnce=%s",
                 timeup, spacefull, manual, clean_at_once)
        count = self.commit_log.mapped_file_queue.delete_expired_file_by_time(
            cfg.file_reserved_time * 3_600_000, cfg.delete_commit_log_files_interval, clean_at_once,
            cfg.delete_file_batch_max, now_ms, cfg.destroy_mapped_file_interval_forcibly)
        if count == 0 and spacefull:
            log.warning("disk space will be full soon, but deleting commitlog files freed nothing")
        self.deleted_files += count
        return count


class CleanConsumeQueueService:
    """Deletes consume queue and index files below the commitlog's minimum offset (`CleanConsumeQueueService`)."""

    def __init__(self, config: StoreConfig, commit_log: CommitLog,
                 consume_queues: Callable[[], Iterable[ConsumeQueue]], index_service: IndexService,
                 dispatched_offset: Callable[[], int] | None = None) -> None:
        self.config = config
        self.commit_log = commit_log
        self.consume_queues = consume_queues
        self.index_service = index_service
        self.dispatched_offset = dispatched_offset
        self.last_physical_min_offset = 0
        self.deleted_files = 0

    def run(self) -> int:
        """One round (`deleteExpiredFiles`); returns how many consume queue and index files were deleted.

        Not before the dispatch has reached the commitlog's new minimum: a queue's min is corrected from
        the units it holds, and one whose units stop short of the minimum (its newer records not dispatched
        yet) would keep a min pointing at deleted records, which no later round corrects (a round runs when
        the minimum moves). The round is left for the next one instead."""
        min_offset = self.commit_log.get_min_offset()
        if min_offset <= self.last_physical_min_offset:
            return 0
        if self.dispatched_offset is not None and self.dispatched_offset() < min_offset:
            return 0
        self.last_physical_min_offset = min_offset
        count = 0
        interval = self.config.delete_consume_queue_files_interval / 1000.0
        for cq in list(self.consume_queues()):
            n = cq.delete_expired_file(min_offset)  # also corrects the queue's min offset
            count += n
            if n and interval > 0:
                time.sleep(interval)
        if self.config.message_index_enable or self.index_service.files:
            count += self.index_service.delete_expired_file(min_offset)
        self.deleted_files += count
        return count


class StoreCleanupService(ServiceThread):
    """The scheduled `cleanFilesPeriodically` task: commitlog first, then consume queues and index."""

    def __init__(self, config: StoreConfig, clean_commit_log: CleanCommitLogService,
                 clean_consume_queue: CleanConsumeQueueService) -> None:
        super().__init__("StoreCleanupService")
        self.config = config
        self.clean_commit_log_service = clean_commit_log
        self.clean_consume_queue_service = clean_consume_queue

    def run_once(self, now_ms: int | None = None) -> int:
        """One cleanup round; returns the number of files deleted."""
        return self.clean_commit_log_service.run(now_ms) + self.clean_consume_queue_service.run()

    def run(self) -> None:
        # first round one minute after start, as RocketMQ schedules it (the disk-full flag is already
        # checked once by MessageStore.start)
        if self._stopped.wait(CLEAN_INITIAL_DELAY_MS / 1000.0):
            return
        while not self._stopped.is_set():
            try:
                self.run_once()
            except Exception:
                self.errors += 1
                log.exception("cleanup round failed")
            self._stopped.wait(self.config.clean_resource_interval / 1000.0)
