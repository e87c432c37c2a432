"""`PopBufferMergeService` (RocketMQ 5's `enablePopBufferMerge`): a pop's checkpoint waits in memory for a
short while, and acks are matched against it there, so that a message popped and acked soon costs no
revive-topic record at all (neither the checkpoint nor the ack).

A checkpoint leaves the buffer in one of two ways:

* **settled**: every message it holds was acked; nothing is ever written for it;
* **stored**: it is written to the revive topic (holding only the messages not acked yet) when it has
  stayed `stay_ms`, or `margin_ms` before its revive time, whichever comes first (the revive service
  calls `flush_due` at the start of each round), when its queue is flushed (a change of invisible time),
  or at shutdown. Acks of a stored checkpoint are written as ack records, as without the buffer.

**The consume offset rule.** The group's consume offset of a queue is what survives a crash (together with
the checkpoints in the revive topic, which move it forward at recovery), so it may move past a pop only once
that pop's checkpoint is stored or settled. The buffer keeps each queue's pops in pop order and commits the
offset after the longest settled-or-stored prefix (RocketMQ's `commitOffsets` scan); further pops of the
queue start at the buffer's own frontier (`pop_offset`), past what is in flight. And a checkpoint of a queue
is only ever stored after every earlier unsettled checkpoint of that queue is, because recovery moves the
offset to the end of the checkpoints it finds: a later checkpoint stored alone would carry the offset past
an earlier one's unacked messages. So, killed at any instant, the broker restarts with the offset before
every message that was neither acked nor in a stored checkpoint, and delivers those again (acked ones
whose pop was not committed yet may come again too: at least once).

One lock guards the buffer; a pop takes it once (after reading under its queue's lock), an ack once per
request, the flush once per round.
"""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from itertools import islice

from ..common.native import native
from ..common.pop import PopCheckPoint, offsets_text

QueueKey = tuple[str, str, int]  # group, topic, queue id
CkKey = tuple[str, str, int, int, int]  # group, topic, queue id, start offset, pop time
# THE POP CORE of `_native`: `ack_one`'s settling of a contiguous entry (`_ack_run`'s bits, journal line and _by_key
# entry) in C; None without the native core (RMQ_EVENTSTORE_PURE=1, not built): `_ack_run` serves
_ACK_SETTLE = getattr(native, "ack_settle", None)


def _ack_mask(diffs: list[int], start: int, offsets: list[int], contiguous: bool) -> int:
    """The bits of a checkpoint (offset diffs `diffs` from `start`) that `offsets` name; offsets it does not
    hold are ignored. One pass over the offsets: when the diffs are 0..n-1 (`contiguous`: no message filtered
    out between them, the usual case) a diff is its own bit, otherwise a diff -> first bit map is used."""
    n = len(diffs)
    mask = 0
    if contiguous:
        for off in offsets:
            d = off - start
            if 0 <= d < n:
                mask |= 1 << d
        return mask
    index = {d: i for i, d in reversed(list(enumerate(diffs)))}
    for off in offsets:
        i = index.get(off - start)
        if i is not None:
            mask |= 1 << i
    return mask


# THE POP ENTRY of `_native`: the base of `_Entry` (its fields as C slots; `ck` made when first read for an entry
# `pop_register` made, so a pop registered in C builds no PopCheckPoint); None without the native core
_ENTRY_BASES = (native.PopEntry,) if native is not None and hasattr(native, "PopEntry") else ()


class _Entry(*_ENTRY_BASES):  # type: ignore[misc]
    """One pop of a queue in the buffer: its checkpoint (None: an offset move only, e.g. filtered
    messages skipped), the offset after it, the acked bits, and whether it is stored."""

    __slots__ = () if _ENTRY_BASES else ("ck", "revive_qid", "next_offset", "acked", "full", "stored", "flush_at",
                                         "contiguous")

    def __init__(self, ck: PopCheckPoint | None, revive_qid: int, next_offset: int, flush_at: int,
                 stored: bool = False) -> None:
        self.ck = ck
        self.revive_qid = revive_qid
        self.next_offset = next_offset
        self.acked = 0
        self.full = (1 << len(ck.queue_offset_diff)) - 1 if ck is not None else 0
        self.contiguous = ck is not None and ck.queue_offset_diff == list(range(len(ck.queue_offset_diff)))
        self.stored = stored
        self.flush_at = flush_at

    @property
    def settled(self) -> bool:
        return self.acked == self.full

    def unacked_ck(self) -> PopCheckPoint:
        """The checkpoint as stored: only the messages not acked yet (same key, so later acks match)."""
        ck = self.ck
        assert ck is not None
        if not self.acked:
            return ck
        diffs = [d for i, d in enumerate(ck.queue_offset_diff) if not self.acked >> i & 1]
        return replace(ck, num=len(diffs), queue_offset_diff=diffs, bit_map=0)


class PopJournal:
    """The buffer's write-ahead journal: one text line per buffered checkpoint (`C`), per ack matched in
    the buffer (`A`) and per checkpoint stored from the buffer (`S`), each appended with one write() before
    the pop's or the ack's response goes out. A SIGKILL keeps what write() handed to the kernel, so a
    restart knows every checkpoint that was only in memory and every ack that settled it: `recover`
    returns them, the broker stores the unsettled ones in the revive topic (their messages then come back
    at their revive time, not at once) and moves the offsets past the settled ones (no acked message comes
    back). Far cheaper than a store put: no record encoding, no dispatch, no arrival wake-ups. The file is
    rewritten when the buffer holds nothing unsettled (or past `max_bytes`) with only the live entries and
    the offsets the buffer committed (`O` lines): consumerOffset.json is written every few seconds only,
    and a settled pop dropped from the journal must still not come back after a crash.

    Lines: `C group topic queue start popTime invisible reviveQid nextOffset diff,diff,...`,
    `A group topic queue start popTime offset,offset,...`, `S group topic queue start popTime`,
    `O group topic queue offset` (group and topic names never hold spaces)."""

    def __init__(self, path: str, max_bytes: int = 8 << 20) -> None:
        self.path = path
        self.max_bytes = max_bytes
        os.makedirs(os.path.dirname(path), exist_ok=True)
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self.size = os.fstat(self._fd).st_size
        self.rewritten = 0  # the size the last rewrite left (its live entries)

    def bound(self) -> int:
        """The size past which the journal is rewritten although entries are live: `max_bytes`, or twice what
        the last rewrite left when its live entries alone passed `max_bytes` (pops nobody acks): the rewrite
        costs O(live), so it may come only after as many new bytes again, not at every round."""
        return max(self.max_bytes, 2 * self.rewritten)

    def _write(self, line: str) -> None:
        data = line.encode()
        os.write(self._fd, data)
        self.size += len(data)

    def ck(self, ck: PopCheckPoint, revive_qid: int, next_offset: int, contiguous: bool = False) -> None:
        """A `C` line; `contiguous`: the diffs are 0..n-1 (written by the C loop)."""
        diffs = ck.queue_offset_diff
        text = offsets_text(0, len(diffs)) if contiguous else ",".join(map(str, diffs))
        self._write(f"C {ck.group} {ck.topic} {ck.queue_id} {ck.start_offset} {ck.pop_time} {ck.invisible_time} "
                    f"{revive_qid} {next_offset} {text}\n")

    def ack(self, key: CkKey, offsets: list[int] | range) -> None:
        text = (offsets_text(offsets.start, offsets.stop) if offsets.__class__ is range and offsets.step == 1
                else ",".join(map(str, offsets)))
        self._write(f"A {key[0]} {key[1]} {key[2]} {key[3]} {key[4]} {text}\n")

    def stored(self, key: CkKey) -> None:
        self._write(f"S {key[0]} {key[1]} {key[2]} {key[3]} {key[4]}\n")

    def reset(self, live: list[_Entry], offsets: dict[QueueKey, int]) -> None:
        """Start the journal afresh with the consume `offsets` the buffer committed and only the `live`
        entries (buffered, not stored, not settled)."""
        if not live and not offsets:
            os.ftruncate(self._fd, 0)
            self.size = self.rewritten = 0
            return
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            f.writelines(f"O {g} {t} {q} {off}\n" for (g, t, q), off in offsets.items())
            for e in live:
                ck = e.ck
                assert ck is not None
                f.write(f"C {ck.group} {ck.topic} {ck.queue_id} {ck.start_offset} {ck.pop_time} "
                        f"{ck.invisible_time} {e.revive_qid} {e.next_offset} "
                        f"{','.join(map(str, ck.queue_offset_diff))}\n")
                if e.acked:
                    acked = [ck.start_offset + d for i, d in enumerate(ck.queue_offset_diff) if e.acked >> i & 1]
                    f.write(f"A {ck.group} {ck.topic} {ck.queue_id} {ck.start_offset} {ck.pop_time} "
                            f"{','.join(map(str, acked))}\n")
        os.replace(tmp, self.path)
        os.close(self._fd)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        self.size = self.rewritten = os.fstat(self._fd).st_size

    @staticmethod
    def recover(path: str, broker_name: str) -> tuple[list[tuple[PopCheckPoint, int, int, int, bool]],
                                                      dict[QueueKey, int]]:
        """What a journal left by a stopped or killed broker says: per checkpoint (ck, revive qid, next
        offset, acked bits, stored), in journal order, and the consume offsets it committed. Lines that
        do not parse (a torn last line) are skipped."""
        out: dict[CkKey, list] = {}
        offsets: dict[QueueKey, int] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                lines = f.read().split("\n")
        except FileNotFoundError:
            return [], offsets
        for line in lines:
            p = line.split(" ")
            try:
                if p[0] == "O" and len(p) == 5:
                    qkey = (p[1], p[2], int(p[3]))
                    offsets[qkey] = max(offsets.get(qkey, -1), int(p[4]))
                elif p[0] == "C" and len(p) == 10:
                    diffs = [int(x) for x in p[9].split(",") if x]
                    ck = PopCheckPoint(int(p[4]), int(p[5]), int(p[6]), len(diffs), int(p[3]), p[2], p[1],
                                       broker_name, diffs)
                    out[(p[1], p[2], int(p[3]), int(p[4]), int(p[5]))] = [ck, int(p[7]), int(p[8]), 0, False]
                elif p[0] in ("A", "S") and len(p) >= 6:
                    rec = out.get((p[1], p[2], int(p[3]), int(p[4]), int(p[5])))
                    if rec is None:
                        continue
                    if p[0] == "S":
                        rec[4] = True
                        continue
                    ck = rec[0]
                    for off in (int(x) for x in p[6].split(",") if x) if len(p) == 7 else ():
                        d = off - ck.start_offset
                        if d in ck.queue_offset_diff:
                            rec[3] |= 1 << ck.queue_offset_diff.index(d)
            except (ValueError, IndexError):
                continue
        return [tuple(v) for v in out.values()], offsets  # type: ignore[misc]

    def close(self) -> None:
        os.close(self._fd)


class PopBufferMergeService:
    """Checkpoints held in memory and matched with acks before either is written (module docstring).
    `put_ck(ck, revive_qid)` writes a checkpoint to the revive topic (True when written); `commit(group,
    topic, queue_id, offset)` moves a consume offset; `committed(group, topic, queue_id)` reads one."""

    def __init__(self, put_ck: Callable[[PopCheckPoint, int], bool],
                 commit: Callable[[str, str, int, int], None], committed: Callable[[str, str, int], int],
                 enabled: bool = True, stay_ms: int = 10_000, margin_ms: int = 500,
                 max_size: int = 200_000, journal: PopJournal | None = None) -> None:
        self.journal = journal
        self._put_ck = put_ck
        self._commit = commit
        self._committed = committed
        self.enabled = enabled
        self.stay_ms = stay_ms
        self.margin_ms = margin_ms
        self.max_size = max_size
        self._lock = threading.Lock()
        self._queues: dict[QueueKey, deque[_Entry]] = {}
        self._by_key: dict[CkKey, _Entry] = {}
        self._count = 0  # entries in the queues
        self._committed_by_me: dict[QueueKey, int] = {}  # offsets this buffer committed (journal O lines)
        self.stored = 0  # checkpoints written by the buffer (statistics)
        self.settled = 0  # checkpoints settled in memory: nothing written for them

    # -- pop side ---------------------------------------------------------------------------------------------
    def pop_offset(self, group: str, topic: str, queue_id: int) -> int:
        """Where the next pop of the queue starts: past what is in the buffer, or the committed offset."""
        with self._lock:
            committed = self._committed(group, topic, queue_id)
            q = self._queues.get((group, topic, queue_id))
            if q:
                nxt = q[-1].next_offset  # max(next_offset, committed)
                return nxt if nxt > committed else committed
            return committed

    def frontier(self, group: str, topic: str, queue_id: int) -> int:
        """The offset after the queue's last buffered pop, -1 when none is buffered (no lock: a read)."""
        q = self._queues.get((group, topic, queue_id))
        try:
            return q[-1].next_offset if q else -1
        except IndexError:  # emptied meanwhile
            return -1

    def rest_offset(self, group: str, topic: str, queue_id: int) -> int:
        """`pop_offset` without the lock, for what a POP only counts (the messages it leaves, restNum), never
        for where a pop starts: the same answer unless an ack settles the queue's pops meanwhile, when it may
        be the offset before them (the count a little high for that one response)."""
        f = self.frontier(group, topic, queue_id)
        c = self._committed(group, topic, queue_id)
        return f if f > c else c

    def add_ck(self, ck: PopCheckPoint, revive_qid: int, next_offset: int) -> bool:
        """Register a pop's checkpoint; its consume offset moves to `next_offset` when the rule allows. With
        the buffer off or full, the checkpoint is written now (after the queue's earlier ones); False when
        that write failed: then nothing was registered and the pop must hand nothing out."""
        qkey = (ck.group, ck.topic, ck.queue_id)
        with self._lock:
            if self.enabled and self._count < self.max_size:
                flush_at = ck.pop_time + max(min(self.stay_ms, ck.invisible_time - self.margin_ms), 0)
                entry = _Entry(ck, revive_qid, next_offset, flush_at)
                if self.journal is not None:
                    self.journal.ck(ck, revive_qid, next_offset, entry.contiguous)
                self._by_key[(ck.group, ck.topic, ck.queue_id, ck.start_offset, ck.pop_time)] = entry
            else:
                self._flush_queue(qkey, None)
                if self._queues.get(qkey):
                    return False  # an earlier checkpoint could not be written: this one may not go first
                if not self._put_ck(ck, revive_qid):
                    return False
                entry = _Entry(ck, revive_qid, next_offset, 0, stored=True)
            q = self._queues.get(qkey)
            if q is None:
                q = self._queues[qkey] = deque()
            q.append(entry)
            self._count += 1
            first = q[0]
            if first.stored or first.acked == first.full:  # else the scan would stop at once
                self._scan_commit(qkey)
        return True

    def add_offset(self, group: str, topic: str, queue_id: int, next_offset: int) -> None:
        """Move the consume offset past messages no pop hands out (filtered, removed): at once when nothing
        of the queue is in the buffer, else in order behind what is."""
        qkey = (group, topic, queue_id)
        with self._lock:
            q = self._queues.get(qkey)
            if not q:
                self._commit(group, topic, queue_id, next_offset)
                self._committed_by_me[qkey] = next_offset
                return
            q.append(_Entry(None, 0, next_offset, 0))
            self._count += 1
            self._scan_commit(qkey)

    # -- ack side ---------------------------------------------------------------------------------------------
    def ack(self, key: CkKey, offsets: list[int] | range) -> bool:
        """Mark acked messages of a buffered checkpoint: True when it was in the buffer and not stored (then
        nothing is to be written), False when the caller must write an ack record. `offsets` may be a
        range (consecutive offsets: no loop over them when the checkpoint's are consecutive too)."""
        with self._lock:
            entry = self._by_key.get(key)
            if entry is None or entry.stored:
                return False
            ck = entry.ck
            assert ck is not None
            if entry.contiguous and offsets.__class__ is range and offsets.step == 1 and offsets:
                first = offsets.start - ck.start_offset
                n = len(ck.queue_offset_diff)
                lo, hi = max(first, 0), min(first + len(offsets), n)  # the bits of [first, first + len) held
                if lo < hi:
                    entry.acked |= ((1 << (hi - lo)) - 1) << lo
            else:
                entry.acked |= _ack_mask(ck.queue_offset_diff, ck.start_offset, offsets, entry.contiguous)
            if self.journal is not None:
                self.journal.ack(key, offsets)
            if entry.acked == entry.full:
                del self._by_key[key]
                self.settled += 1
                self._scan_commit(key[:3])  # type: ignore[arg-type]
            return True

    def ack_one(self, key: CkKey, start: int, stop: int) -> bool:
        """`ack(key, range(start, stop))` (consecutive offsets, start < stop: the usual ack) when `key` is a
        buffered checkpoint that is not stored: the same bits, journal line and offset commit, True. False, with
        nothing changed, otherwise (the caller's general path then writes an ack record). A contiguous entry of at
        most 62 messages is settled in C (`_native.ack_settle`: `_ack_run`'s bits, journal line and _by_key entry)."""
        with self._lock:
            j = self.journal
            if j is not None and _ACK_SETTLE is not None:  # _ack_run for a contiguous entry, in C
                got = _ACK_SETTLE(self._by_key, key, start, stop, j._fd)
                if got is not None:
                    j.size += got[0]
                    if got[1]:  # settled: its _by_key entry is gone
                        self.settled += 1
                        self._scan_commit(key[:3])  # type: ignore[arg-type]
                    return True
            entry = self._by_key.get(key)
            if entry is None or entry.stored:
                return False
            self._ack_run(entry, key, start, stop)
            return True

    def ack_runs(self, runs: list[tuple[CkKey, int, int]]) -> bool:
        """`ack_one` for each `(key, start, stop)` of `runs`, all or nothing under one lock round: False, with
        nothing changed, when a key is not a buffered checkpoint that is not stored, or a key comes twice (then
        the caller's general path decides: an ack record to write, or `ack` per entry in order)."""
        with self._lock:
            by_key = self._by_key
            entries = [by_key.get(key) for key, _, _ in runs]
            if any(e is None or e.stored for e in entries) or len({r[0] for r in runs}) != len(runs):
                return False
            for entry, run in zip(entries, runs, strict=True):
                self._ack_run(entry, *run)  # type: ignore[arg-type]
            return True

    def _ack_run(self, entry: _Entry, key: CkKey, start: int, stop: int) -> None:
        """`ack`'s work for a buffered entry and the offsets start..stop-1 (start < stop), its journal line
        (`PopJournal.ack_run`'s) written here. Lock held."""
        ck = entry.ck
        assert ck is not None
        if entry.contiguous:
            first = start - ck.start_offset
            lo, hi = max(first, 0), min(first + stop - start, len(ck.queue_offset_diff))
            if lo < hi:
                entry.acked |= ((1 << (hi - lo)) - 1) << lo
        else:
            entry.acked |= _ack_mask(ck.queue_offset_diff, ck.start_offset, range(start, stop), False)
        j = self.journal
        if j is not None:
            data = (f"A {key[0]} {key[1]} {key[2]} {key[3]} {key[4]} "
                    f"{start if stop - start == 1 else offsets_text(start, stop)}\n").encode()
            os.write(j._fd, data)
            j.size += len(data)
        if entry.acked == entry.full:
            del self._by_key[key]
            self.settled += 1
            self._scan_commit(key[:3])  # type: ignore[arg-type]

    # -- flush ------------------------------------------------------------------------------------------------
    def flush_due(self, now_ms: int) -> int:
        """Store every checkpoint whose time in the buffer is over (and, per queue, the ones before it);
        how many were written."""
        n = 0
        with self._lock:
            for qkey in list(self._queues):
                n += self._flush_queue(qkey, now_ms)
            j = self.journal
            if j is not None and j.size and (not self._by_key or j.size > j.bound()):
                j.reset(list(self._by_key.values()), self._committed_by_me)
        return n

    def flush_queue(self, group: str, topic: str, queue_id: int) -> None:
        """Store every unsettled checkpoint of the queue (before a checkpoint is written beside them)."""
        with self._lock:
            self._flush_queue((group, topic, queue_id), None)

    def flush_all(self) -> int:
        with self._lock:
            return sum(self._flush_queue(qkey, None) for qkey in list(self._queues))

    def _flush_queue(self, qkey: QueueKey, now_ms: int | None) -> int:
        """Store the queue's unsettled checkpoints in order up to the last one due (all with `now_ms`
        None); stops at a failed write (tried again next round). Lock held."""
        q = self._queues.get(qkey)
        if not q:
            return 0
        last = len(q) - 1
        if now_ms is not None and q[last].flush_at > now_ms:
            # the last one due, walked to from the tail by the deque's own iterator: `q[i]` walks the deque's
            # blocks from the nearer end, so indexing down from the tail cost O(n²) per round in a queue whose
            # pops are never acked (150,000 buffered: 400 ms a round, under the lock every pop and ack takes)
            for e in reversed(q):
                if e.flush_at <= now_ms:
                    break
                last -= 1
            if last < 0:
                return 0
        n = 0
        for e in islice(q, last + 1):
            if e.stored or e.ck is None or e.settled:
                continue
            if not self._put_ck(e.unacked_ck(), e.revive_qid):
                break
            e.stored = True
            key = (e.ck.group, e.ck.topic, e.ck.queue_id, e.ck.start_offset, e.ck.pop_time)
            self._by_key.pop(key, None)
            if self.journal is not None:
                self.journal.stored(key)
            self.stored += 1
            n += 1
        if n:
            self._scan_commit(qkey)
        return n

    def _scan_commit(self, qkey: QueueKey) -> None:
        """Commit the offset after the longest prefix of the queue's pops that are stored or settled, and
        drop that prefix. Lock held."""
        q = self._queues.get(qkey)
        if not q:
            return
        offset = -1
        while q and (q[0].stored or q[0].acked == q[0].full):
            offset = q.popleft().next_offset
            self._count -= 1
        if offset >= 0 and offset > self._committed(*qkey):
            self._commit(*qkey, offset)
            self._committed_by_me[qkey] = offset
        if not q:
            del self._queues[qkey]

    def forget_topic(self, topic: str) -> int:
        """`topic` was deleted: drop its buffered pops without writing anything (their messages are gone with
        the topic) and the offsets this buffer committed for it; returns how many pops went."""
        n = 0
        with self._lock:
            for qkey in [k for k in self._queues if k[1] == topic]:
                n += len(self._queues.pop(qkey))
            self._count -= n
            for key in [k for k in self._by_key if k[1] == topic]:
                del self._by_key[key]
            for qkey in [k for k in self._committed_by_me if k[1] == topic]:
                del self._committed_by_me[qkey]
        return n

    def committed_offsets(self) -> dict[QueueKey, int]:
        """The consume offsets this buffer committed (what the journal keeps when it is emptied)."""
        with self._lock:
            return dict(self._committed_by_me)

    def size(self) -> int:
        """Pops in the buffer (settled or not)."""
        return self._count

    def in_flight(self) -> int:
        """Checkpoints in the buffer with unacked messages, not stored."""
        with self._lock:
            return len(self._by_key)
