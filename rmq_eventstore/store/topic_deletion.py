"""Deleted topics: the durable record that makes a topic deletion crash-safe (`config/topicDeletions.log`).

RocketMQ deletes a topic (`DELETE_TOPIC_IN_BROKER`) by dropping its config, its consumer offsets and its
consume queue files (`DefaultMessageStore.deleteTopics`); its commitlog records stay until the commitlog
files expire. Two things RocketMQ leaves open are closed here:

* **Records stay, so they must not come back.** Recovery (and a reput that had not dispatched them yet)
  would build a consume queue for a record whose queue is missing, and a topic created again starts its
  queue offsets at 0, so the old records must never meet the new queue. A deletion is therefore a
  *cutoff*: (topic, commitlog offset D) taken under the put lock, when the topic's queue offsets are reset.
  Dispatch leaves out the records of the topic before D (`MessageStore._dispatch`), `verify` does not
  expect a queue for them. Records from D on belong to the topic created again.
* **All or nothing across a crash.** The deletion is first appended here (`begin`, fsynced); that is the
  point of no return. Then the queue files, the config and the offsets go, and `done` is appended. A load
  that finds a `begin` without `done` finishes the deletion (roll forward) before the queues are loaded, so
  after a SIGKILL at any point the topic is either fully there (no `begin` yet) or fully gone.

The log is JSON lines, one per event. A cutoff is forgotten once the commitlog no longer holds records
before it (its minimum offset passed D); the log is rewritten (one line per live cutoff) at load when some
were forgotten, and whenever it holds more than 1.5 lines per live cutoff (plus `COMPACT_SLACK`), so a topic
created and deleted 10,000 times costs one line, and 10,000 topics deleted within the retention about
15,000 lines, not an ever-growing log.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from .fsutil import fsync_directory

log = logging.getLogger(__name__)

FILE_NAME = "topicDeletions.log"
COMPACT_SLACK = 256  # lines beyond twice the live cutoffs before the log is rewritten

__all__ = ["FILE_NAME", "TopicDeletionLog", "read_cutoffs"]


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _parse(path: str) -> tuple[dict[str, int], dict[str, int], int]:
    """(cutoffs, pending, lines) of the log at `path`; a torn last line (a crash mid-append) is ignored."""
    cutoffs: dict[str, int] = {}
    pending: dict[str, int] = {}
    lines = 0
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return cutoffs, pending, 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
            topic, offset, state = str(rec["topic"]), int(rec["offset"]), str(rec["state"])
        except (ValueError, KeyError, TypeError):
            log.warning("%s: unreadable line skipped (a torn append?)", path)
            continue
        lines += 1
        if state == "begin":
            cutoffs[topic] = max(cutoffs.get(topic, -1), offset)
            pending[topic] = offset
        elif state == "done":
            if pending.get(topic) == offset:
                del pending[topic]
        elif state == "keep":  # a rewritten log's live cutoff
            cutoffs[topic] = max(cutoffs.get(topic, -1), offset)
    return cutoffs, pending, lines


def read_cutoffs(config_dir: str) -> dict[str, int]:
    """The cutoffs recorded in a store's config directory (read-only: for `verify`)."""
    return _parse(os.path.join(config_dir, FILE_NAME))[0]


class TopicDeletionLog:
    """The store's deletion log: cutoffs by topic (records of the topic before its cutoff are deleted) and
    the deletions begun and not finished (rolled forward at load)."""

    def __init__(self, config_dir: str) -> None:
        self.path = os.path.join(config_dir, FILE_NAME)
        self._lock = threading.Lock()
        self.cutoffs: dict[str, int] = {}
        self.pending: dict[str, int] = {}
        self._lines = 0

    def load(self) -> None:
        """Read the log; a torn last line (a crash mid-append) is cut off, so the next append starts clean."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            if data and not data.endswith(b"\n"):
                os.truncate(self.path, data.rfind(b"\n") + 1)
        except FileNotFoundError:
            pass
        self.cutoffs, self.pending, self._lines = _parse(self.path)

    def is_deleted(self, topic: str, commit_log_offset: int) -> bool:
        cut = self.cutoffs.get(topic)
        return cut is not None and commit_log_offset < cut

    def _append(self, rec: dict) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        new = not os.path.exists(self.path)
        line = (json.dumps(rec, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
        if new:
            fsync_directory(os.path.dirname(self.path))
        self._lines += 1

    def begin(self, topic: str, offset: int) -> None:
        """Durably record that `topic`'s records before `offset` are deleted (the point of no return)."""
        with self._lock:
            self._append({"topic": topic, "offset": offset, "state": "begin"})
            self.cutoffs[topic] = max(self.cutoffs.get(topic, -1), offset)
            self.pending[topic] = offset

    def done(self, topic: str, offset: int) -> None:
        with self._lock:
            self._append({"topic": topic, "offset": offset, "state": "done"})
            if self.pending.get(topic) == offset:
                del self.pending[topic]

    def forget_before(self, min_commit_log_offset: int | None) -> int:
        """Drop cutoffs no record precedes any more (the commitlog starts at or after them; None: do not
        look); rewrite the log when it has grown past 1.5 lines per live cutoff. Returns how many went."""
        with self._lock:
            gone = [] if min_commit_log_offset is None else [
                t for t, d in self.cutoffs.items() if d <= min_commit_log_offset and t not in self.pending]
            for t in gone:
                del self.cutoffs[t]
            live = len(self.cutoffs) + len(self.pending)
            if gone or self._lines > (3 * live) // 2 + COMPACT_SLACK:  # a deletion adds 2 lines and 1 cutoff
                self._rewrite()
            return len(gone)

    def _rewrite(self) -> None:
        if not self.cutoffs and not self.pending:
            try:
                os.unlink(self.path)
                fsync_directory(os.path.dirname(self.path))
            except FileNotFoundError:
                pass
            self._lines = 0
            return
        lines = [{"topic": t, "offset": d, "state": "keep"} for t, d in self.cutoffs.items() if t not in self.pending]
        lines += [{"topic": t, "offset": d, "state": "begin"} for t, d in self.pending.items()]
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in lines).encode()
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, self.path)
        fsync_directory(os.path.dirname(self.path))
        self._lines = len(lines)
