"""Helpers of the broker-level tests: read a whole topic as a consumer would, and wait for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable

from rmq_eventstore.client import FOUND, MessageExt, PullConsumer


def pull_all(namesrv: str, topic: str, group: str = "reader", queues: int = 4) -> list[MessageExt]:
    """Every message a consumer can pull from `topic` (each queue from offset 0), without waiting."""
    out: list[MessageExt] = []
    with PullConsumer(namesrv, group) as c:
        for q in range(queues):
            off = 0
            while True:
                r = c.pull(topic, q, off, max_nums=256, suspend_timeout_ms=0)
                if r.status != FOUND:
                    break
                out += r.messages
                off = r.next_begin_offset
    return out


def wait_until(cond: Callable[[], bool], timeout: float = 15.0, step: float = 0.02) -> bool:
    """Poll `cond` until it holds or `timeout` seconds passed; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()
