"""ReputMessageService: the thread that turns new commitlog records into consume-queue and index entries.

It walks the commitlog from `reput_from_offset` (spec §10.3), hands each batch of records to the
dispatchers (consume queues first, then the index), rolls over BLANK records, and tells arrival
listeners (the broker's long polling) which queues grew. Records this process appended arrive already
parsed through `notify_appended` (as `DispatchRequest`s, or as `DispatchColumns` from a native batch
put); anything else (recovery, records written before a restart) is parsed back from the mapped files.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from ..common import codec
from ..common.codec import DispatchColumns, DispatchRequest

if TYPE_CHECKING:
    from .commitlog import CommitLog

log = logging.getLogger(__name__)

# _take_pending's walk over request chunks in C (one chunk per single put), else the loop below
_take_requests = getattr(codec.native, "take_requests", None)
# a pass over single puts' requests in one C call (MessageStore._dispatch's common case), else the Python pass
_dispatch_singles = getattr(codec.native, "dispatch_singles", None)
MAX_PENDING = 500_000  # above this the put path stops handing over requests; reput parses instead
MAX_BATCH = 8192
REPUT_INTERVAL = 0.0005  # seconds between dispatch passes while messages keep arriving
WAIT_SLICE = 0.05  # wait_for looks at the dispatched offset at least this often


def _chunk_start(chunk: tuple) -> int:
    """Where a pending chunk starts: a (start, end, requests) tuple, or one request alone (a DispatchRequest,
    what notify_appended keeps for a chunk of one record: from its commit_log_offset)."""
    return chunk[0] if chunk.__class__ is tuple else chunk[2]


class ReputMessageService:
    """Dispatch loop from `reput_from_offset` to the commitlog's readable end (`ReputMessageService`)."""

    # the fields `_native.dispatch_singles` and the single put's hand-off read and write are slots (by offset,
    # not by attribute look-up)
    __slots__ = ("reput_from_offset", "dispatched_offset", "_pending", "_pending_count", "_signalled", "listeners",
                 "_gated", "_wakeup", "__dict__", "__weakref__")

    def __init__(self, commit_log: CommitLog, dispatch: Callable[[list[DispatchRequest]], None]) -> None:
        self.commit_log = commit_log
        self.dispatch = dispatch
        self.reput_from_offset = 0  # next record to take
        self.dispatched_offset = 0  # everything before it is in the consume queues and index
        self.listeners: list[Callable[[dict[tuple[str, int], int]], None]] = []
        # listeners called only while a condition holds (add_listener): (fn, obj, attr, queues)
        self._gated: list[tuple[Callable[[dict[tuple[str, int], int]], None], object, str | None,
                                frozenset[tuple[str, int]] | None]] = []
        self._pending: collections.deque = collections.deque()
        self._pending_count = 0
        self._wakeup = threading.Event()
        # True from a hand-off's wake-up until the loop clears it (cleared after the event, before the
        # pass that takes the hand-offs: a hand-off after that point wakes the loop again, none is lost)
        self._signalled = False
        self._progress = threading.Condition()
        self._progress_waiters = 0  # threads in wait_for (changed under _progress's lock)
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one do_reput at a time
        self.errors = 0
        self.after_pass: Callable[[], None] | None = None  # run by the thread after a pass that dispatched
        self._max_offset = commit_log.mapped_file_queue.get_max_offset  # the commit log's readable end
        self._fast_ctx: tuple | None = None  # set_fast_pass
        self._fast_for: Callable | None = None

    def set_fast_pass(self, ctx: tuple) -> None:
        """Let passes take the single puts' requests at the head of the hand-offs in one native call
        (`_native.dispatch_singles`, which writes what `self.dispatch` would: the owner's consume-queue units,
        index entries and checkpoint time; `ctx` names the owner's parts, see MessageStore). Only while
        `self.dispatch` is the dispatcher given now (a test that replaces it gets the Python pass), and only
        with the native core; anything the call does not cover goes through `self.dispatch` as before."""
        if _dispatch_singles is not None:
            self._fast_ctx = ctx
            self._fast_for = self.dispatch

    # -- hand-off from the put path ---------------------------------------------------------------
    def notify_appended(self, start: int, end: int, requests: list | tuple) -> None:
        """Called under the put lock with what was just written to `[start, end)`, in log order.

        A BLANK end-of-file record arrives as a chunk with no requests. Chunks are kept whole so that
        taking them costs nothing per message; a chunk of one request (a single put's) is kept as that
        request alone, which says where it starts and ends (`commit_log_offset`, `msg_size`): one object
        waits per single put, not three (`_native.append_one`'s hand-off keeps the same).
        """
        if self._pending_count < MAX_PENDING:
            n = len(requests)
            r = requests[0] if n == 1 and requests.__class__ is not DispatchColumns else None
            if r.__class__ is DispatchRequest and r[2] == start and start + r[3] == end:  # type: ignore[index]
                self._pending.append(r)
            else:
                self._pending.append((start, end, requests))
            self._pending_count += n
        if not self._signalled:  # the first hand-off since the loop last looked wakes it, later ones do not
            self._signalled = True
            self._wakeup.set()

    def add_listener(self, fn: Callable[[dict[tuple[str, int], int]], None], when: tuple[object, str] | None = None,
                     queues: Iterable[tuple[str, int]] | None = None) -> None:
        """Call `fn({(topic, queue id): next queue offset, ...})` after each pass that dispatched records, or,
        with `when=(obj, attr)`, only while `getattr(obj, attr)` is true (read without any lock: for a
        listener that does nothing otherwise, such as one that wakes waiters and counts them), and with
        `queues` only when one of those queues grew. A gate spares the pass a Python call per listener (the
        native pass looks at the gates in C); what a listener is told is the same."""
        if when is None and queues is None:
            self.listeners.append(fn)
        else:
            self._gated.append((fn, when[0] if when else None, when[1] if when else None,
                                frozenset(queues) if queues is not None else None))

    def wakeup(self) -> None:
        self._wakeup.set()

    def hold_wakeups(self) -> bool:
        """The calling thread promises `dispatch_here()` soon (the broker's event loop, once the responses
        to what it read are written): until then hand-offs do not wake the dispatch thread, so a lone
        request's records cost no thread wake-up and no GIL hand-off. False when a wake-up is due anyway
        (the thread was signalled already): then there is nothing to promise."""
        if self._signalled:
            return False
        self._signalled = True
        return True

    def dispatch_here(self) -> int:
        """After `hold_wakeups()`: one dispatch pass on the calling thread (unless the dispatch thread is
        at it), then hand-offs wake the thread again, and it is woken if anything is left behind. Returns
        the number of records dispatched here; a failure is logged and left to the thread to retry."""
        n = 0
        ctx = self._fast_ctx
        if ctx is not None and self.dispatch is self._fast_for and self._lock.acquire(blocking=False):
            # the common case in one C call, which also clears `_signalled` when nothing is left behind
            try:
                n, grown, behind = _dispatch_singles(self, ctx, True)
            except Exception:
                self.errors += 1
                log.exception("reput on the calling thread failed at %d", self.reput_from_offset)
                grown, behind = None, 1
            finally:
                self._lock.release()
            if grown is not None or (n and self._progress_waiters):
                self._passed(grown)
            if behind <= 0:
                return n
        if self._lock.acquire(blocking=False):
            try:
                n += self._reput_locked(one_pass=True)
            except Exception:
                self.errors += 1
                log.exception("reput on the calling thread failed at %d", self.reput_from_offset)
            finally:
                self._lock.release()
        self._signalled = False
        # a put after the pass saw `_signalled` still set and woke nobody: its end is published by now
        if self._max_offset() > self.dispatched_offset:
            self._signalled = True
            self._wakeup.set()
        return n

    def _passed(self, grown: dict[tuple[str, int], int] | None) -> None:
        """After a pass that dispatched records: the arrival listeners hear which queues grew (`grown`, None
        when no listener is to be called), `wait_for` waiters are woken."""
        if grown is not None:
            for fn in self.listeners:
                try:
                    fn(grown)
                except Exception:  # a listener must never stop dispatch
                    log.exception("arrival listener failed")
            for fn, obj, attr, queues in self._gated:
                if (attr is None or getattr(obj, attr)) and (queues is None or not queues.isdisjoint(grown)):
                    try:
                        fn(grown)
                    except Exception:
                        log.exception("arrival listener failed")
        if self._progress_waiters:  # read without the lock: a waiter looks again every 50 ms anyway
            with self._progress:
                self._progress.notify_all()

    # -- the loop ---------------------------------------------------------------------------------
    def behind(self) -> int:
        """Bytes written but not yet dispatched (`dispatchBehindBytes`)."""
        return self._max_offset() - self.dispatched_offset

    def is_caught_up(self) -> bool:
        return self.behind() <= 0

    def _take_pending(self, limit: int) -> list[DispatchRequest] | DispatchColumns:
        """Whole hand-off chunks that start exactly at reput_from_offset (BLANK chunks just move it):
        requests, or the columns of consecutive native batch puts merged (the two are not mixed)."""
        pend = self._pending
        out: list[DispatchRequest] = []
        cols: list[DispatchColumns] = []
        taken = 0
        offset = self.reput_from_offset
        while pend and taken < MAX_BATCH:
            chunk = pend[0]
            if chunk.__class__ is tuple:
                start, end, reqs = chunk
            else:  # a single put's request alone (notify_appended)
                start = chunk[2]
                end = start + chunk[3]
                reqs = (chunk,)
            if end <= offset:  # already dispatched by a parse
                pend.popleft()
                self._pending_count -= len(reqs)
                continue
            if start != offset or end > limit:
                break
            if reqs.__class__ is DispatchColumns:
                if out:
                    break
                cols.append(reqs)
            elif reqs:
                if cols:
                    break
                if _take_requests is not None:  # this chunk and the request chunks after it, in one C call
                    offset, n = _take_requests(pend, pend.popleft, offset, limit, MAX_BATCH - taken, out)
                    if n:
                        self._pending_count -= n
                        taken += n
                        continue
                out.extend(reqs)
            pend.popleft()
            n = len(reqs)
            self._pending_count -= n
            taken += n
            offset = end
        self.reput_from_offset = offset
        return DispatchColumns.merge(cols) if cols else out

    def _parse(self, limit: int) -> list[DispatchRequest]:
        """Parse records back from the commitlog from reput_from_offset (`doReput`'s buffer walk)."""
        cl = self.commit_log
        out: list[DispatchRequest] = []
        offset = self.reput_from_offset
        pend = self._pending
        stop_at = limit
        if pend and _chunk_start(pend[0]) > offset:
            stop_at = min(stop_at, _chunk_start(pend[0]))
        min_off = cl.get_min_offset()
        if offset < min_off:
            offset = self.reput_from_offset = min_off
        while offset < stop_at and len(out) < MAX_BATCH:
            data = cl.get_data(offset)
            if data is None:
                break
            start, buf = data
            pos = 0
            n = len(buf)
            rolled = False
            while pos < n and start + pos < stop_at and len(out) < MAX_BATCH:
                r = codec.check_message_and_return_size(buf, pos, False, n, delay_levels=cl.encoder.delay_levels)
                if r.success and r.size > 0:
                    if start + pos + r.size > stop_at:
                        break
                    out.append(r.request)
                    pos += r.size
                elif r.success:  # BLANK
                    offset = cl.roll_next_file(start + pos)
                    rolled = True
                    break
                elif r.size > 0:
                    log.error("[BUG] dispatch skipping a record with a bad length at %d: %s", start + pos, r.reason)
                    self.errors += 1
                    pos += r.size
                else:
                    break
            buf.release()
            if rolled:
                if out:
                    # dispatch the records of the previous file first; the roll is taken next round
                    self.reput_from_offset = out[-1].commit_log_offset + out[-1].msg_size
                    return out
                self.reput_from_offset = offset
                continue
            offset = start + pos
            break
        if out:
            last = out[-1]
            self.reput_from_offset = last.commit_log_offset + last.msg_size
        return out

    def do_reput(self) -> int:
        """Dispatch everything readable now; returns the number of records dispatched."""
        with self._lock:
            return self._reput_locked()

    def _reput_locked(self, one_pass: bool = False) -> int:
        total = 0
        ctx = self._fast_ctx if self.dispatch is self._fast_for else None
        while True:
            if ctx is not None:  # the single puts' requests at the head, in one C call
                n, grown, behind = _dispatch_singles(self, ctx, False)
                if n:
                    total += n
                    self._passed(grown)
                    if one_pass or behind <= 0:
                        break
                    continue
            limit = self._max_offset()
            if self.reput_from_offset >= limit:
                break
            before = self.reput_from_offset
            reqs = self._take_pending(limit)
            if not reqs and self.reput_from_offset == before and self._pending_count < MAX_PENDING:
                # A put may have moved the end (read into `limit`) and not yet handed its records over
                # (it does so under the put lock, right after): wait for that rather than parse them back.
                with self.commit_log.put_lock:
                    pass
                reqs = self._take_pending(limit)
            if not reqs and self.reput_from_offset == before:
                reqs = self._parse(limit)
                if not reqs and self.reput_from_offset == before:
                    break
            if reqs:
                try:
                    self.dispatch(reqs)
                except BaseException:
                    # Not dispatched: take these records again (parsed back from the commitlog);
                    # the dispatchers skip whatever part of them they already hold.
                    self.reput_from_offset = self.dispatched_offset
                    raise
            # reput_from_offset moves when records are taken; dispatched_offset once they are in
            # the queues and the index, which is what waiters and shutdown care about.
            self.dispatched_offset = self.reput_from_offset
            if reqs:
                total += len(reqs)
                grown: dict[tuple[str, int], int] | None = None
                if self.listeners or self._gated:
                    if reqs.__class__ is DispatchColumns:
                        grown = reqs.grown()  # type: ignore[union-attr]
                    else:
                        grown = {}
                        for r in reqs:
                            grown[(r.topic, r.queue_id)] = r.consume_queue_offset + 1
                self._passed(grown)
            elif self._progress_waiters:
                with self._progress:
                    self._progress.notify_all()
            if one_pass:
                break
        return total

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._wakeup.wait(0.01)
            self._wakeup.clear()
            self._signalled = False
            try:
                if self.do_reput():
                    if self.after_pass is not None:
                        self.after_pass()
                    # Like RocketMQ's 1 ms reput loop: let puts accumulate into the next batch instead of
                    # waking (and taking the GIL) once per message.
                    time.sleep(REPUT_INTERVAL)
            except Exception:
                self.errors += 1
                log.exception("reput failed at %d", self.reput_from_offset)
                self._stopped.wait(0.1)

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="ReputMessageService", daemon=True)
            self._thread.start()

    def wait_for(self, offset: int | None = None, timeout: float = 5.0) -> bool:
        """Block until everything up to `offset` (default: the current end) is dispatched."""
        target = self._max_offset() if offset is None else offset
        self._wakeup.set()
        deadline = time.monotonic() + timeout
        with self._progress:
            self._progress_waiters += 1
            try:
                # in slices: a pass notifies only when it sees a waiter, and it looks without the lock
                while self.dispatched_offset < target:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._progress.wait(min(remaining, WAIT_SLICE))
                return True
            finally:
                self._progress_waiters -= 1

    def shutdown(self, wait_seconds: float = 5.0) -> None:
        """Stop after catching up (RocketMQ waits up to 5 s for the reput to finish)."""
        if self._thread is not None:
            self.wait_for(None, wait_seconds)
            self._stopped.set()
            self._wakeup.set()
            self._thread.join(timeout=wait_seconds)
            self._thread = None
