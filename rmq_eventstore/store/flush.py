"""Flush and commit services of the commitlog and the consume queues (spec §5.4, §8, §11).

RocketMQ's threads, with its config names and semantics:

* `GroupCommitService` (SYNC_FLUSH): a put hands over a `GroupCommitRequest(next_offset, deadline)` and
  waits. The service swaps its write and read request lists, flushes once for all the requests it took
  (one fdatasync covers every byte appended so far, so concurrent puts share it: group commit), answers
  PUT_OK, and records the flushed file's store time as the checkpoint's physicMsgTimestamp.
* `FlushDiskWatcher`: answers FLUSH_DISK_TIMEOUT to a request still waiting at its deadline
  (`syncFlushTimeout`); the record stays written (`PutMessageResult.is_ok()`), only its durability is late.
* `FlushRealTimeService` (ASYNC_FLUSH): every `flushIntervalCommitLog` flush when at least
  `flushCommitLogLeastPages` pages are dirty, everything every `flushCommitLogThoroughInterval`.
* `CommitRealTimeService` (transient store pool): copy the write buffer into the file every
  `commitIntervalCommitLog` (`commitCommitLogLeastPages`, everything every
  `commitCommitLogThoroughInterval`), then wake the flush service.
* `FlushConsumeQueueService`: every `flushIntervalConsumeQueue` flush the consume queues
  (`flushConsumeQueueLeastPages`; everything every `flushConsumeQueueThoroughInterval`) and force the
  checkpoint, whose logicsMsgTimestamp is the one captured before the last complete queue flush.

Every service has a `run_once`-style method (`do_commit`, `do_flush`) that tests drive directly.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from _thread import allocate_lock as _allocate_lock
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..common.status import PutMessageStatus

if TYPE_CHECKING:
    from .checkpoint import StoreCheckpoint
    from .commitlog import CommitLog
    from .config import StoreConfig
    from .consume_queue import ConsumeQueue

log = logging.getLogger(__name__)

RETRY_TIMES_OVER = 10  # flush / commit attempts at shutdown (CommitLog's RETRY_TIMES_OVER)
CQ_RETRY_TIMES_OVER = 3  # FlushConsumeQueueService's RETRY_TIMES_OVER
GROUP_COMMIT_WAIT = 0.010  # GroupCommitService waits at most 10 ms for requests
WAIT_FOR_PUT_RESULT_EXTRA_MS = 5000  # DefaultMessageStore.waitForPutResult: timeout + 5 s -> UNKNOWN_ERROR

_complete_lock = threading.Lock()


def _now_ms() -> int:
    return int(time.time() * 1000)


class ServiceThread:
    """RocketMQ's `ServiceThread`: a named daemon thread with `wakeup`, `wait_for_running` and `shutdown`."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._stopped = threading.Event()
        self._wakeup = threading.Event()
        self._signalled = False  # a wakeup set the event since the loop last cleared it (wakeup's fast check)
        self._thread: threading.Thread | None = None
        self.errors = 0

    def start(self) -> None:
        if self._thread is None:
            self._stopped.clear()
            self._thread = threading.Thread(target=self._run_guarded, name=self.name, daemon=True)
            self._thread.start()

    def is_running(self) -> bool:
        return self._thread is not None and not self._stopped.is_set()

    def is_stopped(self) -> bool:
        return self._stopped.is_set()

    def wakeup(self) -> None:
        if not self._signalled:  # the first wakeup since the loop last woke sets the event, later ones do not
            self._signalled = True
            self._wakeup.set()

    def wait_for_running(self, interval_s: float) -> None:
        """Wait until woken or `interval_s` passed (returns at once if a wakeup is pending)."""
        self._wakeup.wait(interval_s)
        self._wakeup.clear()
        # after the clear, before the work: a wakeup from here on sets the event again; one in between
        # is for something written before the work that follows, which covers it
        self._signalled = False
        self.on_wait_end()

    def on_wait_end(self) -> None:
        """Hook run after every wait (GroupCommitService swaps its request lists here)."""

    def _run_guarded(self) -> None:
        while not self._stopped.is_set():
            try:
                self.run()
                return
            except Exception:
                self.errors += 1
                log.exception("%s failed; restarting its loop", self.name)
                self._stopped.wait(0.1)

    def run(self) -> None:
        raise NotImplementedError

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the loop and wait for the thread; `on_shutdown` then runs in the caller's thread."""
        self._stopped.set()
        self._wakeup.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout)
        self._thread = None
        self.on_shutdown()

    def on_shutdown(self) -> None:
        """Final work once the loop has ended (flush / commit what is left)."""


class GroupCommitRequest:
    """One waiting put (`GroupCommitRequest`): done once the commitlog is flushed up to `next_offset`.

    The waiter blocks on a bare lock the answer releases: cheaper than an Event (no Condition) on the
    path every SYNC_FLUSH put takes.
    """

    __slots__ = ("next_offset", "deadline", "status", "_done")

    def __init__(self, next_offset: int, timeout_ms: int) -> None:
        self.next_offset = next_offset
        self.deadline = time.monotonic() + timeout_ms / 1000.0
        self.status: PutMessageStatus | None = None
        self._done = _allocate_lock()
        self._done.acquire()

    def wakeup_customer(self, status: PutMessageStatus) -> None:
        """Complete the request (the first answer wins: flushed or timed out)."""
        with _complete_lock:
            if self.status is not None:
                return
            self.status = status
        self._done.release()

    def is_done(self) -> bool:
        return self.status is not None

    def wait(self, timeout_s: float) -> PutMessageStatus:
        """Block until answered; UNKNOWN_ERROR when nobody answered within `timeout_s`."""
        if not self._done.acquire(True, max(0.0, timeout_s)):
            return PutMessageStatus.UNKNOWN_ERROR
        self._done.release()  # later waiters (and is_done checks) see it answered too
        status = self.status
        return status if status is not None else PutMessageStatus.UNKNOWN_ERROR


class FlushDiskWatcher(ServiceThread):
    """Answers FLUSH_DISK_TIMEOUT to sync-flush requests still pending at their deadline (`FlushDiskWatcher`).

    Requests are watched in arrival order; they all have the same timeout, so only the oldest pending
    one can be due. Checking costs one deque operation per request, no per-request thread or timer.
    """

    def __init__(self) -> None:
        super().__init__("FlushDiskWatcher")
        self._requests: collections.deque[GroupCommitRequest] = collections.deque()
        self.timed_out = 0

    def add(self, request: GroupCommitRequest) -> None:
        self._requests.append(request)

    def pending_count(self) -> int:
        """Requests still watched (answered ones leave at the next check)."""
        return len(self._requests)

    def check(self, now: float | None = None) -> float:
        """Time out due requests; returns seconds until the next check is useful."""
        reqs = self._requests
        while reqs:
            head = reqs[0]
            if head.is_done():
                reqs.popleft()
                continue
            t = time.monotonic() if now is None else now
            if t >= head.deadline:
                head.wakeup_customer(PutMessageStatus.FLUSH_DISK_TIMEOUT)
                self.timed_out += 1
                log.warning("sync flush of offset %d did not finish within the timeout", head.next_offset)
                reqs.popleft()
                continue
            return min(0.010, head.deadline - t)
        return 0.010

    def run(self) -> None:
        while not self._stopped.is_set():
            self._stopped.wait(self.check())

    def on_shutdown(self) -> None:
        self._requests.clear()


class _CommitLogService(ServiceThread):
    """Shared parts of the commitlog's flush services."""

    def __init__(self, name: str, commit_log: CommitLog, checkpoint: Callable[[], StoreCheckpoint | None],
                 transient: bool) -> None:
        super().__init__(name)
        self.commit_log = commit_log
        self.config: StoreConfig = commit_log.config
        self.checkpoint = checkpoint
        self.transient = transient  # commit the write buffers before flushing
        self.flush_count = 0

    def _record_physic_timestamp(self) -> None:
        ts = self.commit_log.mapped_file_queue.store_timestamp
        cp = self.checkpoint()
        if ts > 0 and cp is not None:
            cp.physic_msg_timestamp = ts

    def _commit_and_flush(self, least_pages: int) -> bool:
        """Commit (with the pool) and flush one file under the commitlog's flush lock; True when idle."""
        mfq = self.commit_log.mapped_file_queue
        with self.commit_log.flush_lock:
            if self.transient and least_pages == 0:
                for _ in range(2):  # a batch may end in the next file
                    if mfq.commit(0):
                        break
            before = mfq.flushed_where
            result = mfq.flush(least_pages)
            if mfq.flushed_where != before:
                self.flush_count += 1
            return result


class GroupCommitService(_CommitLogService):
    """SYNC_FLUSH: puts wait until their bytes are flushed; all requests taken in one round share a flush."""

    def __init__(self, commit_log: CommitLog, checkpoint: Callable[[], StoreCheckpoint | None],
                 watcher: FlushDiskWatcher | None = None, transient: bool = False) -> None:
        super().__init__("GroupCommitService", commit_log, checkpoint, transient)
        self.watcher = watcher
        self._lock = threading.Lock()
        self._requests_write: list[GroupCommitRequest] = []
        self._requests_read: list[GroupCommitRequest] = []
        self.request_count = 0

    def put_request(self, request: GroupCommitRequest) -> None:
        """Queue a request and wake the service (`putRequest`)."""
        with self._lock:
            self._requests_write.append(request)
        if self.watcher is not None:
            self.watcher.add(request)
        self.wakeup()

    def submit_and_wait(self, next_offset: int, timeout_ms: int) -> PutMessageStatus:
        """What a SYNC_FLUSH put does after appending: PUT_OK, FLUSH_DISK_TIMEOUT or UNKNOWN_ERROR."""
        if self.commit_log.mapped_file_queue.flushed_where >= next_offset:
            return PutMessageStatus.PUT_OK
        if not self.is_running():  # stopping: nobody will take the request, flush in this thread
            return (PutMessageStatus.PUT_OK if self.commit_log.flush_until(next_offset, timeout_ms)
                    else PutMessageStatus.FLUSH_DISK_TIMEOUT)
        req = GroupCommitRequest(next_offset, timeout_ms)
        self.put_request(req)
        return req.wait((timeout_ms + WAIT_FOR_PUT_RESULT_EXTRA_MS) / 1000.0)

    def on_wait_end(self) -> None:
        self._swap_requests()

    def _swap_requests(self) -> None:
        with self._lock:
            self._requests_write, self._requests_read = self._requests_read, self._requests_write

    def do_commit(self) -> None:
        """Answer every request taken by the last swap (`GroupCommitService.doCommit`)."""
        reqs = self._requests_read
        mfq = self.commit_log.mapped_file_queue
        if reqs:
            for req in reqs:
                if req.is_done():  # timed out already
                    continue
                flush_ok = mfq.flushed_where >= req.next_offset
                for _ in range(2):  # the message may end in the next file
                    if flush_ok:
                        break
                    self._commit_and_flush(0)
                    flush_ok = mfq.flushed_where >= req.next_offset
                req.wakeup_customer(PutMessageStatus.PUT_OK if flush_ok else PutMessageStatus.FLUSH_DISK_TIMEOUT)
            self.request_count += len(reqs)
            self._record_physic_timestamp()
            self._requests_read = []
        else:
            # no request: still flush what async puts (WAIT=false) or a batch left behind
            self._commit_and_flush(0)

    def run(self) -> None:
        while not self._stopped.is_set():
            self.wait_for_running(GROUP_COMMIT_WAIT)
            self.do_commit()

    def on_shutdown(self) -> None:
        # RocketMQ: sleep 10 ms, swap, one last commit, so requests made during shutdown are answered
        time.sleep(GROUP_COMMIT_WAIT)
        self._swap_requests()
        self.do_commit()
        self._swap_requests()
        self.do_commit()

    def puts_per_flush(self) -> float:
        """Average number of requests answered per fdatasync since start (the group commit factor)."""
        return self.request_count / self.flush_count if self.flush_count else 0.0


class FlushRealTimeService(_CommitLogService):
    """ASYNC_FLUSH: flush on an interval when enough pages are dirty, and thoroughly now and then."""

    def __init__(self, commit_log: CommitLog, checkpoint: Callable[[], StoreCheckpoint | None]) -> None:
        # with the transient pool, CommitRealTimeService commits and wakes this service to flush
        super().__init__("FlushRealTimeService", commit_log, checkpoint, False)
        self.last_flush_timestamp = 0

    def do_flush(self, now_ms: int | None = None) -> bool:
        """One round: flush with `flushCommitLogLeastPages`, or 0 when the thorough interval passed."""
        cfg = self.config
        now = _now_ms() if now_ms is None else now_ms
        least = cfg.flush_commit_log_least_pages
        if now >= self.last_flush_timestamp + cfg.flush_commit_log_thorough_interval:
            self.last_flush_timestamp = now
            least = 0
        result = self._commit_and_flush(least)
        self._record_physic_timestamp()
        return result

    def run(self) -> None:
        cfg = self.config
        while not self._stopped.is_set():
            if cfg.flush_commit_log_timed:
                self._stopped.wait(cfg.flush_interval_commit_log / 1000.0)
            else:
                self.wait_for_running(cfg.flush_interval_commit_log / 1000.0)
            if self._stopped.is_set():
                break
            self.do_flush()

    def on_shutdown(self) -> None:
        for _ in range(RETRY_TIMES_OVER):
            if self._commit_and_flush(0):
                break
        self._record_physic_timestamp()


class CommitRealTimeService(_CommitLogService):
    """Transient store pool: copy the write buffers into the files, then wake the flush service."""

    def __init__(self, commit_log: CommitLog, flush_service: ServiceThread | None = None) -> None:
        super().__init__("CommitRealTimeService", commit_log, lambda: None, True)
        self.flush_service = flush_service
        self.last_commit_timestamp = 0
        self.commit_count = 0

    def do_commit(self, now_ms: int | None = None) -> bool:
        """One round: commit with `commitCommitLogLeastPages`, or 0 when the thorough interval passed.

        Returns True when nothing was committed."""
        cfg = self.config
        now = _now_ms() if now_ms is None else now_ms
        least = cfg.commit_commit_log_least_pages
        if now >= self.last_commit_timestamp + cfg.commit_commit_log_thorough_interval:
            self.last_commit_timestamp = now
            least = 0
        result = self.commit_log.mapped_file_queue.commit(least)
        if not result:
            self.last_commit_timestamp = now
            self.commit_count += 1
            if self.flush_service is not None:
                self.flush_service.wakeup()  # let the flush service force the new bytes
            wake = self.commit_log.on_committed
            if wake is not None:
                wake()
        return result

    def run(self) -> None:
        cfg = self.config
        while not self._stopped.is_set():
            self.do_commit()
            self.wait_for_running(cfg.commit_interval_commit_log / 1000.0)

    def on_shutdown(self) -> None:
        for _ in range(RETRY_TIMES_OVER):
            if self.commit_log.mapped_file_queue.commit(0):
                break


class WarmAheadService(ServiceThread):
    """Keeps the commitlog's pages faulted in ahead of the writer (`CommitLog.warm_ahead`), on its own thread
    and without the GIL while the kernel works. Woken by the dispatch thread after a pass that found the
    writer within half a window of the warm end (`CommitLog.warm_due`); otherwise it sleeps (one look a
    second), so an idle store costs nothing."""

    def __init__(self, commit_log: CommitLog) -> None:
        super().__init__("WarmAheadService")
        self.commit_log = commit_log

    def run(self) -> None:
        while not self._stopped.is_set():
            self.wait_for_running(1.0)
            if self._stopped.is_set():
                break
            self.commit_log.warm_ahead()


class FlushConsumeQueueService(ServiceThread):
    """Flushes the consume queues and then the checkpoint (`FlushConsumeQueueService` + the 1 s task)."""

    def __init__(self, config: StoreConfig, consume_queues: Callable[[], Iterable[ConsumeQueue]],
                 checkpoint: Callable[[], StoreCheckpoint | None]) -> None:
        super().__init__("FlushConsumeQueueService")
        self.config = config
        self.consume_queues = consume_queues
        self.checkpoint = checkpoint
        self.last_flush_timestamp = 0
        self.durable_logics_msg_timestamp = -1  # logicsMsgTimestamp proven by the last complete flush

    def do_flush(self, retry_times: int = 1, now_ms: int | None = None) -> None:
        """One round (`doFlush`): least pages normally, everything on a thorough round or at shutdown,
        then force the checkpoint (RocketMQ 5.x forces it every second).

        logicsMsgTimestamp is read before the queues are flushed and written back after, as RocketMQ
        does on thorough rounds. Unlike RocketMQ, a round that leaves queue pages unflushed writes the
        last value a complete flush proved, not the dispatcher's newer in-memory value: the checkpoint
        on disk never vouches for queue entries that may not be there after a power loss.
        """
        cfg = self.config
        least = cfg.flush_consume_queue_least_pages
        if retry_times == CQ_RETRY_TIMES_OVER:
            least = 0
        now = _now_ms() if now_ms is None else now_ms
        if now >= self.last_flush_timestamp + cfg.flush_consume_queue_thorough_interval:
            self.last_flush_timestamp = now
            least = 0
        cp = self.checkpoint()
        logics_ts = cp.logics_msg_timestamp if cp is not None else 0
        clean = True
        for cq in list(self.consume_queues()):
            result = False
            for _ in range(retry_times):
                if result:
                    break
                result = cq.flush(least)
            mfq = cq.mapped_file_queue
            if mfq.flushed_where < mfq.get_max_offset():
                clean = False
        if cp is None:
            return
        if clean or least == 0:
            self.durable_logics_msg_timestamp = logics_ts
        durable = self.durable_logics_msg_timestamp
        if durable < 0 or durable == logics_ts:
            cp.logics_msg_timestamp = logics_ts
            cp.flush()
            return
        cp.logics_msg_timestamp = durable
        cp.flush()
        if cp.logics_msg_timestamp == durable:  # give the dispatcher's value back unless it moved on
            cp.logics_msg_timestamp = logics_ts

    def run(self) -> None:
        while not self._stopped.is_set():
            self._stopped.wait(self.config.flush_interval_consume_queue / 1000.0)
            if self._stopped.is_set():
                break
            self.do_flush(1)

    def on_shutdown(self) -> None:
        self.do_flush(CQ_RETRY_TIMES_OVER)
