"""MessageStore: the storage engine's facade, with RocketMQ's `DefaultMessageStore` methods in snake_case.

One process owns a store directory (an OS lock on `<root>/lock`); any number of threads in it may put
and read. Puts go to the commitlog; the reput thread builds consume queues and the key index from it;
reads go through the consume queues (by queue offset) or the index (by key) back to the commitlog.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import struct
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..common import codec
from ..common.filter import MessageFilter
from ..common.message import Message, MessageExt
from ..common.status import GetMessageStatus, PutMessageStatus
from ..common.topic import is_valid_topic
from . import commitlog as _cl
from .checkpoint import StoreCheckpoint
from .cleanup import CleanCommitLogService, CleanConsumeQueueService, RunningFlags, StoreCleanupService
from .commitlog import CommitLog, PutMessageResult, now_ms
from .config import CQ_STORE_UNIT_SIZE, FlushDiskType, StoreConfig
from .config_files import (
    ConsumerOffsetManager,
    DelayOffsetManager,
    SubscriptionGroupManager,
    TopicConfig,
    TopicConfigManager,
)
from .consume_queue import UNIT, ConsumeQueue
from .flush import (
    CommitRealTimeService,
    FlushConsumeQueueService,
    FlushDiskWatcher,
    FlushRealTimeService,
    GroupCommitService,
    WarmAheadService,
)
from .fsutil import fsync_directory
from .index import IndexService
from .mapped_file import StoreLoadError
from .recovery import RecoveryReport, extend_short_last_segment, recover_store
from .reput import ReputMessageService
from .topic_deletion import TopicDeletionLog
from .transient_store_pool import TransientStorePool

log = logging.getLogger(__name__)
_NOT_WRITEABLE = RunningFlags._WRITE_BITS  # RunningFlags.is_writeable's bits (put_message's fast check)
_real_now_ms = _cl._now_ms  # the real clock: a test replacing commitlog.now_ms makes put_message take Python
_SYNC_FLUSH = FlushDiskType.SYNC_FLUSH

MAX_PULL_MSG_SIZE = 128 * 1024 * 1024
BLANK_UNIT_SIZE = 0x7FFFFFFF
_OWNED: set[tuple[int, int]] = set()  # (device, inode) of the lock files this process holds
_OWNED_LOCK = threading.Lock()
DEFAULT_TOPIC_QUEUE_NUMS = 4  # queues recorded in topics.json for a topic created by its first put


class StoreLockedError(RuntimeError):
    """Another process (or another MessageStore in this one) already owns the store directory; `pid` is
    the owner's process id when it could be told (`lock_holder`), else None."""

    def __init__(self, message: str, pid: int | None = None) -> None:
        super().__init__(message)
        self.pid = pid


# struct flock of 64-bit Linux (l_type, l_whence, l_start, l_len, l_pid), for F_GETLK
_FLOCK = struct.Struct("@hhqqi4x") if sys.platform.startswith("linux") and struct.calcsize("l") == 8 else None


def lock_holder(path: str | os.PathLike[str]) -> int | None:
    """The pid of the process holding the lock of the store at `path` (this process's own pid when a
    MessageStore here owns it); None when nobody holds it or it cannot be told.

    The POSIX record lock on byte 0 (the one every owner takes, a Java broker too) is asked about with
    F_GETLK, which locks nothing. Elsewhere than 64-bit Linux, the pid in `abort` is trusted when that
    process is running.
    """
    root = os.fspath(path)
    lock = os.path.join(root, "lock")
    try:
        st = os.stat(lock)
    except OSError:
        return None
    with _OWNED_LOCK:
        if (st.st_dev, st.st_ino) in _OWNED:
            return os.getpid()  # (and never open the file: closing it would drop our own lock)
    if _FLOCK is not None:
        try:
            fd = os.open(lock, os.O_RDONLY)
        except OSError:
            return None
        try:
            got = fcntl.fcntl(fd, fcntl.F_GETLK, _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, 0, 1, 0))
            l_type, _whence, _start, _len, pid = _FLOCK.unpack(got)
        except OSError:
            pass
        else:
            return pid if l_type != fcntl.F_UNLCK and pid > 0 else None
        finally:
            os.close(fd)
    try:
        with open(os.path.join(root, "abort")) as f:
            pid = int(f.read(32).strip() or "0")
        if pid > 0:
            os.kill(pid, 0)
            return pid
    except PermissionError:
        return pid
    except (OSError, ValueError):
        pass
    return None


# what `read_for_pop` answers: status, next begin offset, the queue's max offset, count, records, their offsets
PopRead = tuple[GetMessageStatus, int, int, int, bytes, "range | list[int]"]

# _native.read_runs' statuses (0, 1, 2) and record layout: queue offset, commitlog offset, size
_READ_STATUS = (GetMessageStatus.NO_MATCHED_MESSAGE, GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.FOUND)
_RECORD_LAYOUT = struct.Struct("=qqq")  # _native.read_runs' layout: queue offset, commitlog offset, size


@dataclass(eq=False)
class GetMessageResult:
    """What `get_message` found (`GetMessageResult`): status, offsets and the raw records.

    `message_buffers` are the stored record bytes, `body` the same back to back, ready to send as a pull
    body; `messages` decodes them on first access. The native read fills `body` and a packed layout only:
    the per-record lists are made from them on first access (a pull needs neither).
    """

    status: GetMessageStatus
    next_begin_offset: int = 0
    min_offset: int = 0
    max_offset: int = 0
    buffer_total_size: int = 0
    suggest_pulling_from_slave: bool = False
    _buffers: list[bytes] | None = field(default=None, repr=False)
    _queue_offsets: list[int] | None = field(default=None, repr=False)
    _phy_offsets: list[int] | None = field(default=None, repr=False)
    _body: bytes | None = field(default=None, repr=False)
    _layout: bytes | None = field(default=None, repr=False)
    _messages: list[MessageExt] | None = field(default=None, repr=False)

    def set_records(self, body: bytes, layout: bytes) -> None:
        """The records as `_native.read_runs` returns them: `body` back to back, `layout` (queue offset,
        commitlog offset, size) per record as native int64s."""
        self._body, self._layout = body, layout
        self._buffers = self._queue_offsets = self._phy_offsets = None

    def _unpack(self) -> None:
        bufs: list[bytes] = []
        qo: list[int] = []
        po: list[int] = []
        if self._layout:
            body = self._body
            assert body is not None
            p = 0
            for q, phy, size in _RECORD_LAYOUT.iter_unpack(self._layout):
                qo.append(q)
                po.append(phy)
                bufs.append(body[p:p + size])
                p += size
        self._buffers, self._queue_offsets, self._phy_offsets = bufs, qo, po

    @property
    def message_buffers(self) -> list[bytes]:
        if self._buffers is None:
            self._unpack()
        assert self._buffers is not None
        return self._buffers

    @property
    def message_queue_offsets(self) -> list[int]:
        if self._queue_offsets is None:
            self._unpack()
        assert self._queue_offsets is not None
        return self._queue_offsets

    @property
    def commit_log_offsets(self) -> list[int]:
        if self._phy_offsets is None:
            self._unpack()
        assert self._phy_offsets is not None
        return self._phy_offsets

    @property
    def body(self) -> bytes:
        """The records back to back (a pull response's body)."""
        if self._body is not None:  # set only by set_records, after which the lists are not appended to
            return self._body
        return b"".join(self.message_buffers)

    @property
    def message_count(self) -> int:
        if self._buffers is None and self._layout is not None:
            return len(self._layout) // _RECORD_LAYOUT.size
        return len(self.message_buffers)

    @property
    def messages(self) -> list[MessageExt]:
        if self._messages is None:
            self._messages = [codec.decode_message(b, 0) for b in self.message_buffers]
        return self._messages

    def _key(self) -> tuple:
        return (self.status, self.next_begin_offset, self.min_offset, self.max_offset, self.message_buffers,
                self.message_queue_offsets, self.commit_log_offsets, self.buffer_total_size,
                self.suggest_pulling_from_slave)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, GetMessageResult):
            return NotImplemented
        return self._key() == other._key()

    __hash__ = None  # type: ignore[assignment]  # mutable, as the dataclass it was


@dataclass
class QueryMessageResult:
    """Messages found by key (`QueryMessageResult`), only those whose topic and key really match."""

    messages: list[MessageExt] = field(default_factory=list)
    index_last_update_timestamp: int = 0
    index_last_update_phyoffset: int = 0


class MessageStore:
    """The RocketMQ store on one directory: commitlog, consume queues, index, checkpoint, config files.

    Use `MessageStore.open(path, **config)` (load + start, a context manager), or construct with a
    `StoreConfig` and call `load()` then `start()`; `shutdown()` flushes everything and releases the lock.
    """

    def __init__(self, config: StoreConfig | None = None, **overrides: object) -> None:
        if config is None:
            config = StoreConfig(**overrides)  # type: ignore[arg-type]
        elif overrides:
            config = config.replace(**overrides)
        self.config = config
        self.commit_log = CommitLog(config)
        self.consume_queue_table: dict[str, dict[int, ConsumeQueue]] = {}
        self._cq_lock = threading.Lock()
        # held by each dispatch of a batch and by a topic deletion while it drops the topic's queues, so a
        # record of the topic created again never lands in a queue being deleted
        self._dispatch_lock = threading.Lock()
        self._delete_lock = threading.Lock()  # one topic deletion at a time
        self.topic_deletions = TopicDeletionLog(config.config_path)
        self._deletions_min_offset = -1
        self.index_service = IndexService(config.index_path, config.max_hash_slot_num, config.max_index_num,
                                          config.max_msgs_num_batch, on_index_file_full=self._on_index_file_full)
        self.checkpoint: StoreCheckpoint | None = None
        self.reput_message_service = ReputMessageService(self.commit_log, self._dispatch)
        # `_dispatch`'s common case (single puts going in order into the current files) in one native call:
        # the parts it reads and writes, in the order `_native.dispatch_singles` expects them
        self.reput_message_service.set_fast_pass((self.commit_log.mapped_file_queue, self.consume_queue_table,
                                                  self.topic_deletions, self.index_service, config, self,
                                                  self._dispatch_lock))
        self.commit_log.on_appended = self.reput_message_service.notify_appended
        self._lock_fd: int | None = None
        self._lock_key = (0, 0)
        self._loaded = False
        self._started = False
        self._shutdown = False
        # Durability services (flush.py, cleanup.py), created by start()
        self.running_flags = RunningFlags()
        self.transient_store_pool: TransientStorePool | None = None
        self.flush_disk_watcher: FlushDiskWatcher | None = None
        self.flush_commit_log_service: GroupCommitService | FlushRealTimeService | None = None
        self.commit_real_time_service: CommitRealTimeService | None = None
        self.flush_consume_queue_service: FlushConsumeQueueService | None = None
        self.warm_ahead_service: WarmAheadService | None = None
        self.clean_commit_log_service = CleanCommitLogService(config, self.commit_log, self.running_flags)
        self.clean_consume_queue_service = CleanConsumeQueueService(
            config, self.commit_log, self._all_consume_queues, self.index_service,
            lambda: self.reput_message_service.dispatched_offset)
        self.cleanup_service = StoreCleanupService(config, self.clean_commit_log_service,
                                                   self.clean_consume_queue_service)
        self._total_ram = _total_physical_memory()
        self.last_exit_ok = True
        self._rebuilt_queues: list[str] = []  # consume queues dropped as damaged at load
        self.recovery_report: RecoveryReport | None = None
        # The broker's config files (<root>/config/*.json, each with a .bak), loaded with the store.
        self.topic_config_manager = TopicConfigManager(config.config_path)
        self.consumer_offset_manager = ConsumerOffsetManager(config.config_path)
        self.subscription_group_manager = SubscriptionGroupManager(config.config_path)
        self.delay_offset_manager = DelayOffsetManager(config.config_path)
        self.commit_log.on_new_queue = self._on_new_queue

    # -- lifecycle ----------------------------------------------------------------------------------
    @classmethod
    def open(cls, path: str | os.PathLike[str], **config: object) -> MessageStore:
        """Open (creating if needed) the store at `path`: load, recover and start it."""
        store = cls(StoreConfig(store_path_root_dir=os.fspath(path), **config))  # type: ignore[arg-type]
        store.load()
        store.start()
        return store

    def __enter__(self) -> MessageStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _refuse(self) -> StoreLockedError:
        root = self.config.store_path_root_dir
        pid = lock_holder(root)
        held = "the lock file is held" + ("" if pid is None else f" by pid {pid}"
                                          + (", this process" if pid == os.getpid() else ""))
        return StoreLockedError(
            f"store {root} is already open in another process or MessageStore "
            f"({held}); one process owns a store - talk to it through its broker", pid)

    def _acquire_lock(self) -> None:
        root = self.config.store_path_root_dir
        os.makedirs(root, exist_ok=True)
        # A store this process already owns is refused before opening the lock file again: closing any
        # descriptor of that file would drop the owner's POSIX lock (fcntl semantics).
        try:
            st = os.stat(self.config.lock_path)
            with _OWNED_LOCK:
                owned = (st.st_dev, st.st_ino) in _OWNED
            if owned:
                raise self._refuse()  # (outside _OWNED_LOCK: _refuse asks lock_holder, which takes it)
        except FileNotFoundError:
            pass
        fd = os.open(self.config.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            # flock guards against our own processes and other MessageStores in this process (it is
            # tied to this open file description); the POSIX record lock on byte 0 is the one a Java
            # RocketMQ broker takes (FileChannel.tryLock(0, 1)), so neither opens a store the other owns.
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
        except OSError:
            os.close(fd)
            raise self._refuse() from None
        os.pwrite(fd, b"lock", 0)
        os.fsync(fd)
        st = os.fstat(fd)
        with _OWNED_LOCK:
            _OWNED.add((st.st_dev, st.st_ino))
        self._lock_key = (st.st_dev, st.st_ino)
        self._lock_fd = fd

    def load(self, *, drop_derived: bool = False, progress: Callable[[int], None] | None = None) -> bool:
        """Map the files and recover: find the commitlog end, trim queues past it, rebuild what is missing.

        `drop_derived` deletes the consume queues and the index first (under the lock), so recovery
        rebuilds them from the commitlog (`rmq-eventstore rebuild`); `progress(n)` is told about every
        `n` commitlog bytes recovery walks.
        """
        if self._loaded:
            return True
        self._acquire_lock()
        try:
            if drop_derived:
                for path in (self.config.consume_queue_path, self.config.index_path):
                    shutil.rmtree(path, ignore_errors=True)
            self.last_exit_ok = not os.path.exists(self.config.abort_path)
            for manager in (self.topic_config_manager, self.consumer_offset_manager,
                            self.subscription_group_manager, self.delay_offset_manager):
                manager.load()
            self.topic_deletions.load()
            self._roll_forward_deletions()
            extend_short_last_segment(self.config.commit_log_path, self.config.mapped_file_size_commit_log)
            self.commit_log.load()
            self._load_consume_queues()
            self.checkpoint = StoreCheckpoint(self.config.checkpoint_path)
            # Index files are kept after an abnormal exit: recovery checks the newest ones against the
            # commitlog and drops only those that do not match (RocketMQ deletes them, issue #8007).
            self.index_service.load(True, self.checkpoint.index_msg_timestamp)
            self._recover(progress)
            self._forget_old_deletions()
        except BaseException:
            self._release_lock()
            raise
        self._loaded = True
        return True

    def _on_new_queue(self, topic: str, queue_id: int) -> None:
        """First message of a topic-queue: make sure topics.json knows the topic and enough queues."""
        tc = self.topic_config_manager.get(topic)
        if tc is None or tc.write_queue_nums <= queue_id or tc.read_queue_nums <= queue_id:
            n = max(queue_id + 1, tc.write_queue_nums if tc else 0, DEFAULT_TOPIC_QUEUE_NUMS)
            new = tc.copy() if tc is not None else TopicConfig(topic)
            new.read_queue_nums = new.write_queue_nums = n
            try:
                self.topic_config_manager.put(new)
            except Exception:  # a config file problem must not fail the put itself
                log.exception("could not record topic %r in topics.json", topic)

    def _on_index_file_full(self, end_timestamp: int) -> None:
        if self.checkpoint is not None:
            self.checkpoint.index_msg_timestamp = end_timestamp
            self.checkpoint.flush()

    def _load_consume_queues(self) -> None:
        root = self.config.consume_queue_path
        if not os.path.isdir(root):
            return
        for topic in sorted(os.listdir(root)):
            tdir = os.path.join(root, topic)
            if not os.path.isdir(tdir):
                continue
            if not is_valid_topic(topic):
                log.warning("ignoring consume queue directory with an illegal topic name: %r", topic)
                continue
            for q in os.listdir(tdir):
                if not q.isdigit():
                    continue
                cq = ConsumeQueue(topic, int(q), root, self.config.mapped_file_size_consume_queue)
                try:
                    cq.load()
                except StoreLoadError as e:
                    if _consistent_foreign_geometry(cq.queue_dir, cq.mapped_file_size):
                        raise  # every file has another size: the store was written with another geometry
                    # A damaged derived file (RocketMQ #10108): drop the queue, recovery rebuilds it.
                    log.warning("consume queue %s-%s is damaged (%s): rebuilding it from the commitlog",
                                topic, q, e)
                    for mf in cq.mapped_file_queue.mapped_files:
                        mf.close()
                    shutil.rmtree(cq.queue_dir, ignore_errors=True)
                    self._rebuilt_queues.append(f"{topic}-{q}")
                    continue
                self.consume_queue_table.setdefault(topic, {})[int(q)] = cq

    def _all_consume_queues(self) -> Iterator[ConsumeQueue]:
        for queues in list(self.consume_queue_table.values()):
            yield from list(queues.values())

    def _recover(self, progress: Callable[[int], None] | None = None) -> None:
        """Recovery (spec §9, recovery.py): find the commitlog end (verified from the checkpoint after a
        clean stop, scanned with CRC after a crash), cut the queues and index past it and dispatch
        only the records they lack."""
        self.recovery_report = recover_store(self, progress, rebuilt=self._rebuilt_queues)
        self._recover_topic_queue_table()

    def _recover_topic_queue_table(self) -> None:
        table: dict[str, int] = {}
        min_phy = self.commit_log.get_min_offset()
        for cq in self._all_consume_queues():
            table[f"{cq.topic}-{cq.queue_id}"] = cq.get_max_offset_in_queue()
            cq.correct_min_offset(min_phy)
        self.commit_log.topic_queue_table = table

    def start(self) -> None:
        """Start the reput, flush, commit and cleanup services and mark the store running (`abort`)."""
        if not self._loaded:
            self.load()
        if self._started:
            return
        cfg = self.config
        with open(cfg.abort_path, "w") as f:
            f.write(str(os.getpid()))
        transient = self.is_transient_store_pool_enable()
        if transient:
            self.transient_store_pool = TransientStorePool(cfg.transient_store_pool_size,
                                                           cfg.mapped_file_size_commit_log)
            self.transient_store_pool.init()
            self.commit_log.mapped_file_queue.transient_store_pool = self.transient_store_pool
        cp = self._get_checkpoint
        if cfg.flush_disk_type == FlushDiskType.SYNC_FLUSH:
            self.flush_disk_watcher = FlushDiskWatcher()
            gcs = GroupCommitService(self.commit_log, cp, self.flush_disk_watcher, transient)
            self.flush_commit_log_service = gcs
            self.commit_log.group_commit_service = gcs
        else:
            self.flush_commit_log_service = FlushRealTimeService(self.commit_log, cp)
        if transient:
            self.commit_real_time_service = CommitRealTimeService(self.commit_log, self.flush_commit_log_service)
            # readers and the dispatcher see committed bytes only: wake the reput after each commit
            self.commit_log.on_committed = self.reput_message_service.wakeup
            self.commit_log.flush_wakeup = self.commit_real_time_service.wakeup
        elif cfg.flush_disk_type == FlushDiskType.ASYNC_FLUSH and not cfg.flush_commit_log_timed:
            # timed (the default, as RocketMQ's flushCommitLogTimed) the flush thread sleeps its interval
            # whatever happens: waking it per put would be a call for nothing
            self.commit_log.flush_wakeup = self.flush_commit_log_service.wakeup
        self.flush_consume_queue_service = FlushConsumeQueueService(cfg, self._all_consume_queues, cp)
        if cfg.warm_ahead_bytes > 0 and not transient:  # a write buffer is warm already
            warm = self.warm_ahead_service = WarmAheadService(self.commit_log)
            warm_due = self.commit_log.warm_due

            def after_pass() -> None:
                if warm_due():
                    warm.wakeup()

            self.reput_message_service.after_pass = after_pass
        self.clean_commit_log_service.is_space_to_delete()  # the disk watermark holds from the first put
        self.reput_message_service.start()
        for svc in (self.flush_disk_watcher, self.flush_commit_log_service, self.commit_real_time_service,
                    self.flush_consume_queue_service, self.cleanup_service, self.warm_ahead_service):
            if svc is not None:
                svc.start()
        self._started = True

    def _get_checkpoint(self) -> StoreCheckpoint | None:
        return self.checkpoint

    def is_transient_store_pool_enable(self) -> bool:
        """`isTransientStorePoolEnable`: the write-buffer mode is configured (this store is always a master)."""
        return self.config.transient_store_pool_enable

    def flush_and_checkpoint(self) -> None:
        """Commit and flush the commitlog, then every consume queue, then record their store times in the
        checkpoint and force it: everything stored at or before min(physicMsgTimestamp,
        logicsMsgTimestamp) is then on disk in both."""
        cp = self.checkpoint
        physic_ts = self.commit_log.mapped_file_queue.get_last_mapped_file_or_none()
        physic_ts = physic_ts.store_timestamp if physic_ts is not None else 0
        for _ in range(3):
            if self.commit_log.flush(0):
                break
        logics_ts = cp.logics_msg_timestamp if cp is not None else 0
        for cq in self._all_consume_queues():
            cq.flush(0)
        if cp is not None:
            if physic_ts > 0:
                cp.physic_msg_timestamp = physic_ts
            cp.logics_msg_timestamp = logics_ts
            cp.flush()

    def shutdown(self) -> None:
        """Catch up dispatch, flush everything, remove `abort` when clean, release the lock."""
        if self._shutdown:
            return
        self._shutdown = True
        self.commit_log.writeable = False
        if self.commit_real_time_service is not None:
            self.commit_real_time_service.shutdown()  # commit the write buffers: the reput sees all
        self.reput_message_service.shutdown()
        if self.warm_ahead_service is not None:
            self.warm_ahead_service.shutdown()
        self.cleanup_service.shutdown()
        for svc in (self.flush_commit_log_service, self.flush_consume_queue_service, self.flush_disk_watcher):
            if svc is not None:
                svc.shutdown()
        clean = self.reput_message_service.is_caught_up()
        if self._loaded:
            self.flush_and_checkpoint()
            for cq in self._all_consume_queues():
                cq.shutdown()
            self.index_service.flush()
            self.index_service.shutdown()
            if self.checkpoint is not None:
                if clean:  # the exact end: the next load verifies it instead of rescanning (recovery.py)
                    self.checkpoint.confirm_phy_offset = self.commit_log.get_max_offset()
                self.checkpoint.shutdown()
            for manager in (self.consumer_offset_manager, self.delay_offset_manager):
                try:
                    manager.persist()
                except Exception:
                    log.exception("could not persist %s", manager.config_file_path())
            self.commit_log.shutdown()
            if self.transient_store_pool is not None:
                self.transient_store_pool.destroy()
            if clean and self._started:
                try:
                    os.unlink(self.config.abort_path)
                except FileNotFoundError:
                    pass
        self._release_lock()

    def _release_lock(self) -> None:
        if self._lock_fd is not None:
            try:
                fcntl.lockf(self._lock_fd, fcntl.LOCK_UN, 1, 0)
                fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
            finally:
                os.close(self._lock_fd)
                self._lock_fd = None
                with _OWNED_LOCK:
                    _OWNED.discard(self._lock_key)

    # -- dispatch -----------------------------------------------------------------------------------
    def _dispatch(self, requests: list[codec.DispatchRequest] | codec.DispatchColumns) -> None:
        """CommitLogDispatcherBuildConsumeQueue then CommitLogDispatcherBuildIndex for one batch: requests,
        or the columns a native batch put handed over (`codec.DispatchColumns`, the same entries). Records of
        a deleted topic from before its deletion get no consume queue unit (`topic_deletions`); the batch
        holds the dispatch lock, which a topic deletion takes while it drops the topic's queues."""
        if requests.__class__ is codec.DispatchColumns:
            self._dispatch_columns(requests)  # type: ignore[arg-type]
            return
        cut = self.topic_deletions.cutoffs
        queued = requests
        if cut:
            queued = [r for r in requests if r[0] not in cut or r[2] >= cut[r[0]]]
        with self._dispatch_lock:
            raw = (codec.native.group_units(queued, codec.TRANSACTION_PREPARED_TYPE) if codec.native is not None
                   else None)
            if raw is not None:  # [((topic, queue id), int64 rows as bytes)]
                for (topic, queue_id), packed in raw:
                    cq = self.find_consume_queue(topic, queue_id)
                    if cq is None:
                        log.error("not dispatching %d records of illegal topic %r", len(packed) // 32, topic)
                        continue
                    cq.put_units_packed(packed)
            for (topic, queue_id), units in (group_units_py(queued) if raw is None else {}).items():
                cq = self.find_consume_queue(topic, queue_id)
                if cq is None:
                    log.error("not dispatching %d records of illegal topic %r", len(units), topic)
                    continue
                cq.put_message_position_infos(units)
        if self.checkpoint is not None and requests:
            # in memory only; flush_and_checkpoint makes it durable after the queues are flushed
            self.checkpoint.logics_msg_timestamp = requests[-1].store_timestamp
        if self.config.message_index_enable:
            self.index_service.build_index(requests)

    def _dispatch_columns(self, cols: codec.DispatchColumns) -> None:
        """`_dispatch` of columns: each queue's units and the batch's index entries written as they are (the
        units of a deleted topic from before its deletion left out)."""
        cut = self.topic_deletions.cutoffs
        with self._dispatch_lock:
            for (topic, queue_id), units in cols.units:
                if cut and topic in cut:
                    rows = np.frombuffer(units, dtype=np.int64).reshape(-1, 4)
                    rows = rows[rows[:, 0] >= cut[topic]]
                    if not len(rows):
                        continue
                    units = rows.tobytes()
                cq = self.find_consume_queue(topic, queue_id)
                if cq is None:
                    log.error("not dispatching %d records of illegal topic %r", len(units) // 32, topic)
                    continue
                cq.put_units_packed(units)
        if self.checkpoint is not None and cols.count:
            self.checkpoint.logics_msg_timestamp = cols.store_timestamp
        if self.config.message_index_enable:
            self.index_service.build_index_columns(cols.hashes, cols.phy, cols.ts)

    def find_consume_queue(self, topic: str, queue_id: int, create: bool = True) -> ConsumeQueue | None:
        queues = self.consume_queue_table.get(topic)
        if queues is not None:
            cq = queues.get(queue_id)
            if cq is not None:
                return cq
        if not create or not is_valid_topic(topic) or queue_id < 0:
            return None
        with self._cq_lock:
            queues = self.consume_queue_table.setdefault(topic, {})
            cq = queues.get(queue_id)
            if cq is None:
                cq = ConsumeQueue(topic, queue_id, self.config.consume_queue_path,
                                  self.config.mapped_file_size_consume_queue)
                cq.load()
                queues[queue_id] = cq
            return cq

    # -- topic deletion ------------------------------------------------------------------------------
    def delete_topic(self, topic: str, crash_at: Callable[[str], None] | None = None) -> bool:
        """Delete `topic` (`DefaultMessageStore.deleteTopics` plus what the broker's managers drop): its
        consume queues (mappings closed first), its entry in topics.json and every group's offsets in it.
        Its commitlog records stay until the commitlog files expire, but never come back in a queue: the
        deletion is a cutoff (see `topic_deletion`), recorded durably before anything is removed, and a load
        after a crash finishes it. Returns False when the store knew nothing of the topic. `crash_at(step)`
        is called between the steps (the crash tests kill the process there)."""
        step = crash_at or (lambda _s: None)
        with self._delete_lock:
            prefix = topic + "-"
            known = (topic in self.consume_queue_table or self.topic_config_manager.get(topic) is not None
                     or bool(self.consumer_offset_manager.which_group_by_topic(topic))
                     or any(k.startswith(prefix) and k[len(prefix):].isdigit()
                            for k in list(self.commit_log.topic_queue_table)))
            if not known:
                return False
            step("before-begin")
            with self._dispatch_lock:
                with self.commit_log.put_lock:
                    cutoff = self.commit_log.get_max_offset()
                    self.topic_deletions.begin(topic, cutoff)
                    table = self.commit_log.topic_queue_table
                    for key in [k for k in table if k.startswith(prefix) and k[len(prefix):].isdigit()]:
                        del table[key]
                step("after-begin")
                with self._cq_lock:
                    queues = self.consume_queue_table.pop(topic, {})
                for cq in queues.values():
                    cq.shutdown()
                step("queues-closed")
                self._remove_queue_dirs(topic, cutoff, everything=True, step=step)
            step("queues-deleted")
            self.topic_config_manager.delete(topic)
            step("config-deleted")
            if self.consumer_offset_manager.clean_offset_by_topic(topic):
                self.consumer_offset_manager.persist()
            step("offsets-deleted")
            self.topic_deletions.done(topic, cutoff)
            self._forget_old_deletions()
        log.info("deleted topic %s (its records before commitlog offset %d stay until the commitlog expires)",
                 topic, cutoff)
        return True

    def _remove_queue_dirs(self, topic: str, cutoff: int, everything: bool,
                           step: Callable[[str], None] | None = None) -> int:
        """Delete the consume queue directories of `topic` that belong to before its deletion at `cutoff`
        (all of them with `everything`; at a roll forward, those whose first unit points before the
        cutoff: a queue of the topic created again points after it). Returns how many queues are kept."""
        tdir = os.path.join(self.config.consume_queue_path, topic)
        kept = 0
        try:
            names = os.listdir(tdir)
        except FileNotFoundError:
            return 0
        for q in names:
            qdir = os.path.join(tdir, q)
            if not everything and q.isdigit() and _first_unit_offset(qdir) >= cutoff:
                kept += 1
                continue
            shutil.rmtree(qdir, ignore_errors=True)
            if step is not None:
                step("queue-dir-removed")
        if not kept:
            try:
                os.rmdir(tdir)
            except OSError:
                pass
        fsync_directory(self.config.consume_queue_path)
        return kept

    def _roll_forward_deletions(self) -> None:
        """Finish the deletions a crash interrupted (a `begin` without `done`), before the queues load."""
        for topic, cutoff in list(self.topic_deletions.pending.items()):
            kept = self._remove_queue_dirs(topic, cutoff, everything=False)
            if kept:  # the topic was created again (sent to) during the deletion: it stays, with its new queue
                old = self.topic_config_manager.get(topic)
                if old is None:
                    self.topic_config_manager.put(TopicConfig(topic, max(kept, 1), max(kept, 1)))
            else:
                self.topic_config_manager.delete(topic)
            if self.consumer_offset_manager.clean_offset_by_topic(topic):
                self.consumer_offset_manager.persist()
            self.topic_deletions.done(topic, cutoff)
            log.warning("finished the deletion of topic %s that a crash interrupted", topic)

    def _forget_old_deletions(self) -> None:
        """Drop deletion cutoffs the commitlog has no record before any more (after its files expired)."""
        files = self.commit_log.mapped_file_queue.mapped_files
        low = self.commit_log.get_min_offset() if files else self.commit_log.get_max_offset()
        scan = low != self._deletions_min_offset  # (the cutoffs are walked only when the log's start moved)
        self._deletions_min_offset = low
        self.topic_deletions.forget_before(max(low, 0) if scan else None)

    def add_message_arriving_listener(self, listener: Callable[[dict[tuple[str, int], int]], None],
                                      when: tuple[object, str] | None = None,
                                      queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Call `listener({(topic, queue_id): new max queue offset, ...})` after each dispatched batch.

        This is RocketMQ's `MessageArrivingListener` hook, batched: a broker's long polling wakes the
        pulls waiting on those queues. It runs on the dispatching thread and must not block. `when=(obj,
        attr)`: only while `getattr(obj, attr)` is true; `queues`: only when one of them grew
        (`ReputMessageService.add_listener`: a listener with nothing to do is not called at all).
        """
        self.reput_message_service.add_listener(listener, when, queues)

    def wait_for_dispatch(self, timeout: float = 5.0) -> bool:
        """Block until every record written so far is in the consume queues and index."""
        return self.reput_message_service.wait_for(None, timeout)

    def dispatch_behind_bytes(self) -> int:
        return self.reput_message_service.behind()

    # -- put --------------------------------------------------------------------------------------------
    def _check_running(self) -> PutMessageResult | None:
        """`checkStoreStatus`: refuse puts when the store is stopped or not writeable (disk full)."""
        if self._shutdown or not self._started:
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None,
                                    "the store is not running (call start(), or it was shut down)")
        if not self.running_flags.is_writeable():
            return PutMessageResult(PutMessageStatus.SERVICE_NOT_AVAILABLE, None,
                                    f"the message store is not writeable: {self.running_flags.why_not_writeable()}")
        if self.commit_log.is_os_page_cache_busy():
            return PutMessageResult(PutMessageStatus.OS_PAGE_CACHE_BUSY, None, "put lock held too long")
        return None

    def put_message(self, msg: Message) -> PutMessageResult:
        """Append one message; errors come back as a status with a reason, nothing is raised."""
        cl = self.commit_log
        if (self._started and not self._shutdown and not self.running_flags.flag_bits & _NOT_WRITEABLE
                and not cl.begin_time_in_lock):  # `_check_running` passes: nothing to check further
            put_one = _cl.native_put_one
            cfg = cl.config
            if (put_one is not None and cl.writeable and not cl.read_only and cfg.flush_disk_type is not _SYNC_FLUSH
                    and _cl.now_ms is _real_now_ms):  # CommitLog.put_message's native path, inline
                fast = put_one(cl, msg, cl.uniq_ids if cfg.auto_create_uniq_key else None, cl.encoder, cl.put_lock,
                               cl.file_size, cl.flush_wakeup)
                if fast is not None:
                    return fast if fast.__class__ is not tuple else cl.put_declined(msg, fast[0])
            return cl.put_message(msg)
        bad = self._check_running()
        return bad if bad is not None else cl.put_message(msg)

    def put_messages(self, msgs: Sequence[Message]) -> PutMessageResult:
        """Append a batch under one lock into one file (consecutive queue offsets per queue)."""
        bad = self._check_running()
        return bad if bad is not None else self.commit_log.put_messages(msgs)

    # -- get by queue offset ------------------------------------------------------------------------------
    def _is_in_memory(self, max_phy: int, offset_py: int) -> bool:
        return (max_phy - offset_py) <= self._total_ram * self.config.access_message_in_memory_max_ratio // 100

    def _is_the_batch_full(self, size_py: int, max_msg_nums: int, max_total: int, bytes_so_far: int,
                           count: int, in_memory: bool) -> bool:
        if count == 0 or bytes_so_far == 0:
            return False
        if count + 1 > max_msg_nums or bytes_so_far + size_py > max_total:
            return True
        cfg = self.config
        if in_memory:
            return (bytes_so_far + size_py > cfg.max_transfer_bytes_on_message_in_memory
                    or count > cfg.max_transfer_count_on_message_in_memory - 1)
        return (bytes_so_far + size_py > cfg.max_transfer_bytes_on_message_in_disk
                or count > cfg.max_transfer_count_on_message_in_disk - 1)

    def get_message(
        self, group: str, topic: str, queue_id: int, offset: int, max_msg_nums: int,
        message_filter: MessageFilter | str | None = None, max_total_msg_size: int | None = None,
    ) -> GetMessageResult | None:
        """Read up to `max_msg_nums` messages of a queue from `offset` (`DefaultMessageStore.getMessage`).

        Statuses and `next_begin_offset` follow RocketMQ (spec §12.2), including the per-call transfer
        limits (32 messages / 256 KiB while the data is in memory). None once the store is shut down.
        """
        if self._shutdown or not self._loaded:
            return None  # as RocketMQ: no result (and no new offset for the consumer) from a stopped store
        try:
            return self._get_message(topic, queue_id, offset, max_msg_nums, message_filter, max_total_msg_size)
        except ValueError:
            if self._shutdown:  # the files were unmapped under this read
                return None
            raise

    def _get_message(self, topic: str, queue_id: int, offset: int, max_msg_nums: int,
                     message_filter: MessageFilter | str | None,
                     max_total_msg_size: int | None) -> GetMessageResult:
        if isinstance(message_filter, str):
            message_filter = MessageFilter(message_filter)
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, 0, 0, 0)
        min_offset = cq.get_min_offset_in_queue()
        max_offset = cq.get_max_offset_in_queue()
        res = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, offset, min_offset, max_offset)
        if max_offset == 0:
            res.next_begin_offset = 0
            return res
        if offset < min_offset:
            res.status, res.next_begin_offset = GetMessageStatus.OFFSET_TOO_SMALL, min_offset
            return res
        if offset == max_offset:
            res.status, res.next_begin_offset = GetMessageStatus.OFFSET_OVERFLOW_ONE, offset
            return res
        if offset > max_offset:
            res.status, res.next_begin_offset = GetMessageStatus.OFFSET_OVERFLOW_BADLY, max_offset
            return res
        max_total = MAX_PULL_MSG_SIZE if max_total_msg_size is None else min(max(max_total_msg_size, 100),
                                                                              MAX_PULL_MSG_SIZE)
        match_all = message_filter is None or message_filter.match_all
        if match_all:
            window = max_msg_nums  # nothing is skipped: no need to read the filter window
        else:
            window = max(self.config.max_filter_message_size, max_msg_nums * CQ_STORE_UNIT_SIZE) // CQ_STORE_UNIT_SIZE
        native = match_all and codec.pull_native is not None
        units: list[tuple[int, int, int]] | bytes = (cq.get_units_raw(offset, window) if native
                                                     else cq.get_units(offset, window))
        if not units:
            res.status = GetMessageStatus.OFFSET_FOUND_NULL
            res.next_begin_offset = cq.roll_next_file(offset)
            return res
        max_phy = self.commit_log.get_max_offset()
        min_phy = self.commit_log.get_min_offset()
        if match_all:
            if isinstance(units, bytes):
                fast = self._get_matching_all_native(res, units, offset, max_msg_nums, max_total, max_phy, min_phy)
                units = list(UNIT.iter_unpack(units))
            else:
                fast = self._get_matching_all(res, units, offset, max_msg_nums, max_total, max_phy, min_phy)
            if fast is not None:
                return fast
            res = GetMessageResult(GetMessageStatus.NO_MESSAGE_IN_QUEUE, offset, min_offset, max_offset)
        assert isinstance(units, list)
        return self._get_by_units(res, units, offset, max_msg_nums, max_total, max_phy, min_phy, message_filter)

    def read_for_pop(self, topic: str, queue_id: int, cq: ConsumeQueue, offset: int, max_msg_nums: int,
                     message_filter: MessageFilter | None) -> PopRead | None:
        """`get_message` of the queue `cq` (`topic`, `queue_id`) as a POP uses it: (status, next begin offset,
        the queue's max offset, how many records, the records back to back, their queue offsets: a range when
        they are consecutive); None when get_message answers None. A filter that matches everything is read
        by the native loop without get_message's result object (the same statuses, offsets, limits and
        bytes); anything else (another filter, an offset outside the queue, no record there, no native
        module, a file gone under the read) goes through get_message itself."""
        impl = codec.pull_native
        if (impl is not None and not self._shutdown and self._loaded
                and (message_filter is None or message_filter.match_all)):
            max_offset = cq.get_max_offset_in_queue()
            if cq.get_min_offset_in_queue() <= offset < max_offset:
                try:
                    units = cq.get_units_raw(offset, max_msg_nums)
                    r = self._read_runs(units, offset, max_msg_nums, MAX_PULL_MSG_SIZE, impl,
                                        self._mem_floor(self.commit_log.get_max_offset()),
                                        self.commit_log.get_min_offset()) if units else None
                except ValueError:
                    if self._shutdown:  # the files were unmapped under this read
                        return None
                    raise
                if r is not None:
                    status, taken, _total, _max_pulled, body, layout = r
                    n = len(layout) // _RECORD_LAYOUT.size
                    end = offset + taken
                    return (_READ_STATUS[status], end, max_offset, n, body,
                            range(offset, end) if taken == n else [q for q, _, _ in _RECORD_LAYOUT.iter_unpack(layout)])
        res = self.get_message("", topic, queue_id, offset, max_msg_nums, message_filter)
        if res is None:
            return None
        n = res.message_count
        end = res.next_begin_offset
        return (res.status, end, res.max_offset, n, res.body if n else b"",
                range(offset, end) if end - offset == n else res.message_queue_offsets)

    def _mem_floor(self, max_phy: int) -> int:
        """The lowest commitlog offset still counted as in memory (`accessMessageInMemoryMaxRatio`)."""
        return max_phy - self._total_ram * self.config.access_message_in_memory_max_ratio // 100

    def _read_runs(self, units: bytes, offset: int, max_msg_nums: int, max_total: int, impl: Any,
                   mem_floor: int, min_phy: int) -> tuple[int, int, int, int, bytes, bytes] | None:
        """`_native.read_runs` over the units with the store's transfer limits (None: a file went away)."""
        cfg = self.config
        return impl.read_runs(
            units, offset, max_msg_nums, max_total, mem_floor, cfg.max_transfer_bytes_on_message_in_memory,
            cfg.max_transfer_count_on_message_in_memory, cfg.max_transfer_bytes_on_message_in_disk,
            cfg.max_transfer_count_on_message_in_disk, min_phy, self._file_span)

    def _file_span(self, offset: int) -> tuple[int, int, memoryview] | None:
        """The commitlog file holding `offset`: (its start, its readable end, its view), for `read_runs`."""
        mf = self.commit_log.find_file(offset)
        if mf is None:
            return None
        base = mf.file_from_offset
        return base, base + mf.get_read_position(), mf.view

    def _get_matching_all_native(self, res: GetMessageResult, units: bytes, offset: int, max_msg_nums: int,
                                 max_total: int, max_phy: int, min_phy: int,
                                 impl: Any = None) -> GetMessageResult | None:
        """`_get_matching_all` in C (`_native.read_runs`) on the units' stored bytes: the same statuses,
        offsets and limits; the records come back as one `body` (one copy out of the mapped files), the
        per-record lists are made only if asked for. None when a file went away under the read. `impl`:
        the native module (default `codec.pull_native`; tests pass it whatever `RMQ_EVENTSTORE_PURE` says)."""
        mem_floor = self._mem_floor(max_phy)
        impl = impl if impl is not None else codec.pull_native
        assert impl is not None
        r = self._read_runs(units, offset, max_msg_nums, max_total, impl, mem_floor, min_phy)
        if r is None:
            return None
        status, taken, total, max_pulled, body, layout = r
        res.status = _READ_STATUS[status]
        res.next_begin_offset = offset + taken
        res.buffer_total_size = total
        res.set_records(body, layout)
        if max_pulled >= 0:
            res.suggest_pulling_from_slave = max_pulled < mem_floor
        return res

    def _get_matching_all(self, res: GetMessageResult, units: list[tuple[int, int, int]], offset: int,
                          max_msg_nums: int, max_total: int, max_phy: int,
                          min_phy: int) -> GetMessageResult | None:
        """`_get_by_units` for a filter that matches everything, with the same statuses, offsets and
        limits, but no per-unit method calls: the transfer limits are computed once, the commitlog file
        is looked up once per file, and each run of consecutive records is copied with one slice.
        None when a file went away under the read (cleanup): the caller then reads unit by unit."""
        cfg = self.config
        mem_floor = self._mem_floor(max_phy)
        mem_bytes, mem_count = cfg.max_transfer_bytes_on_message_in_memory, cfg.max_transfer_count_on_message_in_memory
        disk_bytes, disk_count = cfg.max_transfer_bytes_on_message_in_disk, cfg.max_transfer_count_on_message_in_disk
        find_file = self.commit_log.find_file
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        queue_offsets = res.message_queue_offsets
        phy_offsets = res.commit_log_offsets
        runs: list[tuple[memoryview, int, list[int]]] = []  # (file view, start in the file, record sizes)
        run_sizes: list[int] = []
        cur_base = cur_limit = run_end = -1
        cur_view: memoryview | None = None
        count = total = taken = 0
        max_pulled = -1
        for offset_py, size_py, _tags_code in units:
            if count and total:
                if count >= max_msg_nums or total + size_py > max_total:
                    break
                if offset_py >= mem_floor:  # _is_in_memory
                    if total + size_py > mem_bytes or count > mem_count - 1:
                        break
                elif total + size_py > disk_bytes or count > disk_count - 1:
                    break
            taken += 1
            if size_py == BLANK_UNIT_SIZE or size_py <= 0:
                continue
            if offset_py < min_phy:
                if not count:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            end = offset_py + size_py
            if offset_py < cur_base or end > cur_limit:
                mf = find_file(offset_py)
                if mf is None:
                    cur_base = cur_limit = -1
                else:
                    cur_base = mf.file_from_offset
                    cur_limit = cur_base + mf.get_read_position()
                    cur_view = mf.view
                if offset_py < cur_base or end > cur_limit:  # not readable (select_mapped_buffer's None)
                    if not count:
                        status = GetMessageStatus.MESSAGE_WAS_REMOVING
                    continue
            if offset_py == run_end and runs[-1][0] is cur_view:
                run_sizes.append(size_py)
            else:
                run_sizes = [size_py]
                assert cur_view is not None
                runs.append((cur_view, offset_py - cur_base, run_sizes))
            run_end = end
            queue_offsets.append(offset + taken - 1)
            phy_offsets.append(offset_py)
            count += 1
            total += size_py
            max_pulled = offset_py
            status = GetMessageStatus.FOUND
        bufs = res.message_buffers
        for view, start, sizes in runs:
            try:
                blob = bytes(view[start:start + sum(sizes)])
            except ValueError:  # the file was destroyed (cleanup) under this read
                return None
            if len(sizes) == 1:
                bufs.append(blob)
                continue
            p = 0
            for size in sizes:
                bufs.append(blob[p:p + size])
                p += size
        res.status = status
        res.next_begin_offset = offset + taken
        res.buffer_total_size = total
        if max_pulled >= 0:
            res.suggest_pulling_from_slave = max_pulled < mem_floor
        return res

    def _get_by_units(self, res: GetMessageResult, units: list[tuple[int, int, int]], offset: int,
                      max_msg_nums: int, max_total: int, max_phy: int, min_phy: int,
                      message_filter: MessageFilter | None) -> GetMessageResult:
        """The general read loop of `getMessage`: one consume-queue unit at a time, with the tag filter."""
        status = GetMessageStatus.NO_MATCHED_MESSAGE
        next_begin = offset
        bufs = res.message_buffers
        total_bytes = 0
        max_pulled = -1
        for i, (offset_py, size_py, tags_code) in enumerate(units):
            if self._is_the_batch_full(size_py, max_msg_nums, max_total, total_bytes, len(bufs),
                                       self._is_in_memory(max_phy, offset_py)):
                break
            next_begin = offset + i + 1
            if size_py == BLANK_UNIT_SIZE or size_py <= 0:
                continue
            if offset_py < min_phy:
                if not bufs:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            if message_filter is not None and not message_filter.is_matched_by_consume_queue(tags_code):
                continue
            data = self.commit_log.get_message(offset_py, size_py)
            if data is None:
                if not bufs:
                    status = GetMessageStatus.MESSAGE_WAS_REMOVING
                continue
            raw = bytes(data)
            data.release()
            if message_filter is not None and not message_filter.match_all:
                try:
                    m = codec.decode_message(raw, 0)
                except codec.CorruptRecordError:
                    continue
                if not message_filter.is_matched_by_commit_log(m):
                    continue
            bufs.append(raw)
            res.message_queue_offsets.append(offset + i)
            res.commit_log_offsets.append(offset_py)
            total_bytes += size_py
            max_pulled = offset_py
            status = GetMessageStatus.FOUND
        res.status = status
        res.next_begin_offset = next_begin
        res.buffer_total_size = total_bytes
        if max_pulled >= 0:
            res.suggest_pulling_from_slave = (max_phy - max_pulled) > self._total_ram * \
                self.config.access_message_in_memory_max_ratio // 100
        return res

    # -- get by key / id / offset ------------------------------------------------------------------------
    def query_message(self, topic: str, key: str, max_num: int = 32, begin_timestamp: int = 0,
                      end_timestamp: int | None = None, *, batch_limit: int | None = None) -> QueryMessageResult:
        """The newest messages of `topic` whose KEYS or UNIQ_KEY equal `key`, in log order (`queryMessage`).

        The index returns hash matches; every candidate is read back and kept only if its topic and key
        really match (so `AaTopic`/`BB` never returns a message of `BBTopic`/`Aa`, RocketMQ #3613). At most
        `max_msgs_num_batch` (64) candidates are read per query, as RocketMQ; `batch_limit` raises that cap
        for callers that need every message of a key (a stream's events).
        """
        end = end_timestamp if end_timestamp is not None else 2**62
        out = QueryMessageResult()
        seen: set[int] = set()
        last_query_end = end
        for _ in range(3):
            r = self.index_service.query_offset(topic, key, max_num, begin_timestamp, last_query_end, batch_limit)
            out.index_last_update_timestamp = r.index_last_update_timestamp
            out.index_last_update_phyoffset = r.index_last_update_phyoffset
            offsets = sorted(set(r.phy_offsets))
            found_any = False
            for off in offsets:
                if off in seen:
                    continue
                seen.add(off)
                msg = self.commit_log.look_message_by_offset(off)
                if msg is None:
                    continue
                if msg.topic != topic or (key not in msg.keys_list() and msg.uniq_key != key):
                    continue
                out.messages.append(msg)
                found_any = True
                if len(out.messages) >= max_num:
                    break
            if found_any or len(out.messages) >= max_num or not offsets:
                break
            first = self.commit_log.look_message_by_offset(offsets[0])
            if first is None:
                break
            last_query_end = first.store_timestamp
        out.messages.sort(key=lambda m: m.commit_log_offset)
        return out

    def _read(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run a commitlog read; None when the store is shut down (or shuts down under the read)."""
        if self._shutdown or not self._loaded:
            return None
        try:
            return fn(*args)
        except ValueError:
            if self._shutdown:
                return None
            raise

    def look_message_by_offset(self, commit_log_offset: int, size: int | None = None) -> MessageExt | None:
        """The message whose record starts at `commit_log_offset`, or None."""
        return self._read(self.commit_log.look_message_by_offset, commit_log_offset, size)

    def view_message_by_id(self, offset_msg_id: str) -> MessageExt | None:
        """The message with this offsetMsgId (store host + port + commitlog offset)."""
        _host, _port, offset = codec.decode_message_id(offset_msg_id)
        return self.look_message_by_offset(offset)

    def select_one_message_by_offset(self, commit_log_offset: int) -> bytes | None:
        buf = self._read(self.commit_log.read_record, commit_log_offset)
        return bytes(buf) if buf is not None else None

    # -- offsets -----------------------------------------------------------------------------------------
    def get_max_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        return cq.get_max_offset_in_queue() if cq is not None else 0

    def get_min_offset_in_queue(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        return cq.get_min_offset_in_queue() if cq is not None else -1

    def get_commit_log_offset_in_queue(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        unit = cq.get_unit(consume_queue_offset) if cq is not None else None
        return unit[0] if unit is not None else 0

    def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int) -> int:
        """The first queue offset whose store time is ≥ `timestamp` (0 for an unknown queue)."""
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return 0
        return cq.get_offset_in_queue_by_time(timestamp, self.commit_log.pickup_store_timestamp)

    def get_message_store_timestamp(self, topic: str, queue_id: int, consume_queue_offset: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        unit = cq.get_unit(consume_queue_offset) if cq is not None else None
        if unit is None:
            return -1
        return self.commit_log.pickup_store_timestamp(unit[0], unit[1])

    def get_earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.find_consume_queue(topic, queue_id, create=False)
        if cq is None:
            return -1
        return self.get_message_store_timestamp(topic, queue_id, cq.get_min_offset_in_queue())

    def get_max_phy_offset(self) -> int:
        return self.commit_log.get_max_offset()

    def get_min_phy_offset(self) -> int:
        return self.commit_log.get_min_offset()

    def topics(self) -> list[str]:
        return sorted(self.consume_queue_table)

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(self.consume_queue_table.get(topic, {}))

    def now(self) -> int:
        return now_ms()


def group_units(requests: Sequence[codec.DispatchRequest]) -> dict[tuple[str, int], Sequence]:
    """The consume-queue units of a dispatched batch per (topic, queue id), in log order: int64 arrays of
    `(commitLogOffset, size, tagsCode, cqOffset)` rows from the native loop when it is active
    (`codec.NATIVE`), else `group_units_py`'s lists of tuples (the reference; same values)."""
    if codec.native is not None:
        raw = codec.native.group_units(requests, codec.TRANSACTION_PREPARED_TYPE)
        if raw is not None:
            return {key: np.frombuffer(units, dtype=np.int64).reshape(-1, 4) for key, units in raw}
    return group_units_py(requests)


def group_units_py(requests: Sequence[codec.DispatchRequest]) -> dict[tuple[str, int], list[tuple[int, int, int, int]]]:
    """`CommitLogDispatcherBuildConsumeQueue`'s part of a batch, grouped per queue: PREPARED and ROLLBACK
    records get no unit; the others `(commitLogOffset, size, tagsCode, cqOffset)` in log order."""
    groups: dict[tuple[str, int], list[tuple[int, int, int, int]]] = {}
    last_key: tuple[str, int] | None = None
    g: list[tuple[int, int, int, int]] = []
    for topic, queue_id, offset, size, tags_code, _ts, cq_offset, _k, _u, sys_flag, _p, _s in requests:
        if sys_flag & codec.TRANSACTION_PREPARED_TYPE:  # PREPARED (0x4) or ROLLBACK (0xC): no queue
            continue
        if last_key is None or last_key[0] != topic or last_key[1] != queue_id:
            last_key = (topic, queue_id)
            g = groups.get(last_key)
            if g is None:
                g = groups[last_key] = []
        g.append((offset, size, tags_code, cq_offset))
    return groups


def _first_unit_offset(queue_dir: str) -> int:
    """The commitlog offset the first unit of a consume queue directory points at (-1: none, or unreadable)."""
    try:
        names = sorted(n for n in os.listdir(queue_dir) if n.isdigit())
    except OSError:
        return -1
    for name in names:
        try:
            with open(os.path.join(queue_dir, name), "rb") as f:
                head = f.read(8)
        except OSError:
            continue
        if len(head) == 8:
            off = struct.unpack(">q", head)[0]
            return off if off > 0 else -1
    return -1


def _consistent_foreign_geometry(queue_dir: str, configured: int) -> bool:
    """True when all files of a consume queue share one size, a multiple of 20 other than `configured`:
    a geometry mismatch (a configuration error), not damage."""
    try:
        sizes = {os.path.getsize(os.path.join(queue_dir, n)) for n in os.listdir(queue_dir) if n.isdigit()}
    except OSError:
        return False
    if len(sizes) != 1:
        return False
    size = sizes.pop()
    return size != configured and size > 0 and size % CQ_STORE_UNIT_SIZE == 0


def _total_physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 * 1024**3
