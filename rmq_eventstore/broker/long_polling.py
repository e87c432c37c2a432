"""Long polling (`PullRequestHoldService`): pulls that found nothing wait for the store's arrival listener
(the reput thread) or their timeout. `PullHold` is what a processor returns for such a pull."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from ..remoting import RemotingCommand

log = logging.getLogger(__name__)


@dataclass
class PullHold:
    """A pull that found nothing and asked to be suspended: wait for an arrival or the timeout, then
    call `Broker.process_pull(request, channel, allow_suspend=False)`."""

    request: RemotingCommand
    topic: str
    queue_id: int
    offset: int
    timeout_ms: int


class PullRequestHoldService:
    """Held pulls by (topic, queue id); `notify_message_arriving` (reput thread) wakes those behind the
    new max offset. Waking calls the hold's `wake` callback exactly once; it must not block."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._waiters: dict[tuple[str, int], dict[int, tuple[int, Callable[[], None]]]] = {}
        self._next = 0

    def hold(self, topic: str, queue_id: int, offset: int, wake: Callable[[], None]) -> tuple:
        with self._lock:
            self._next += 1
            token = self._next
            self._waiters.setdefault((topic, queue_id), {})[token] = (offset, wake)
        return (topic, queue_id, token)

    def cancel(self, handle: tuple) -> None:
        topic, queue_id, token = handle
        with self._lock:
            w = self._waiters.get((topic, queue_id))
            if w is not None:
                w.pop(token, None)
                if not w:
                    del self._waiters[(topic, queue_id)]

    def notify_message_arriving(self, batch: dict[tuple[str, int], int]) -> None:
        if not self._waiters:
            return
        woken = []
        with self._lock:
            for key, max_offset in batch.items():
                w = self._waiters.get(key)
                if not w:
                    continue
                for token in [t for t, (off, _) in w.items() if max_offset > off]:
                    woken.append(w.pop(token)[1])
                if not w:
                    del self._waiters[key]
        for wake in woken:
            try:
                wake()
            except Exception:
                log.exception("waking a held pull failed")

    def held_count(self) -> int:
        with self._lock:
            return sum(len(w) for w in self._waiters.values())
