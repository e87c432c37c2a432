"""Delay levels (`messageDelayLevel`): RocketMQ's default list and its parser, shared by the codec (the
tags code of a `SCHEDULE_TOPIC_XXXX` unit is its delivery time), the store config and the broker."""

from __future__ import annotations

DEFAULT_MESSAGE_DELAY_LEVEL = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_delay_levels(spec: str) -> list[int]:
    """`messageDelayLevel` ("1s 5s 10s 30s 1m ... 2h") → delay in ms per level, level 1 first
    (`DefaultMessageStore.parseDelayLevel`, spec §14). Raises ValueError for an entry that is not a
    number followed by s/m/h/d, or for an empty list."""
    out = []
    for token in spec.split():
        unit = _DELAY_UNITS_MS.get(token[-1:])
        num = token[:-1]
        if unit is None or not num.isascii() or not num.isdigit():
            raise ValueError(f"bad messageDelayLevel entry {token!r} (expected a number and s/m/h/d)")
        out.append(int(num) * unit)
    if not out:
        raise ValueError("messageDelayLevel is empty")
    return out


DEFAULT_DELAY_LEVELS_MS = tuple(parse_delay_levels(DEFAULT_MESSAGE_DELAY_LEVEL))
