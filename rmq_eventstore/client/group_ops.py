"""Operations on consumer groups (event handlers' offsets): lag per queue, reset to a time or an offset, and
replay of a range of a topic into one handler, as RocketMQ's `mqadmin consumerProgress`,
`resetOffsetByTime` and a re-read of a queue range do.

A reset writes the group's committed offsets (UPDATE_CONSUMER_OFFSET). A live member keeps its own position
in memory and would commit over it, so a reset refuses while the group has live members (stop its workers
first) unless `force=True`. A replay reads the range and calls the handler in this process; it neither reads
nor moves the group's offsets.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..common import MessageExt
from ..common.filter import MessageFilter
from ..common.topic import validate_group, validate_topic
from ..remoting import RemotingCommand, RequestCode, ResponseCode
from .admin import Admin
from .base import loads_body
from .consumer import FOUND, PullConsumer

REPLAY_GROUP = "rmq_eventstore_replay"


class GroupOperationError(RuntimeError):
    """A group operation that cannot run as asked (live members, a bad range); nothing was changed."""


@dataclass(frozen=True)
class QueueLag:
    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int

    @property
    def lag(self) -> int:
        return max(self.broker_offset - max(self.consumer_offset, 0), 0)


def _ms(when: datetime.datetime | int) -> int:
    if isinstance(when, datetime.datetime):
        if when.tzinfo is None:
            raise ValueError("give an aware datetime (with a time zone), or epoch milliseconds")
        return int(when.timestamp() * 1000)
    return int(when)


def group_lag(admin: Admin, group: str, topic: str | None = None) -> list[QueueLag]:
    """The group's committed offset against each queue's end, per queue (GET_CONSUME_STATS)."""
    validate_group(group)
    stats = admin.consume_stats(group, topic)
    return [QueueLag(q.topic, q.queue_id, q.broker_offset, q.consumer_offset) for q in stats.queues]


def live_members(admin: Admin, group: str, topic: str) -> list[str]:
    """Client ids of the group's live consumers (GET_CONSUMER_LIST_BY_GROUP on the topic's broker)."""
    base = admin._base
    r = base.invoke(base.broker_for(topic), RemotingCommand.request(RequestCode.GET_CONSUMER_LIST_BY_GROUP,
                                                                    {"consumerGroup": group}),
                    ok=(ResponseCode.SUCCESS, ResponseCode.SYSTEM_ERROR))
    return list(loads_body(r.body).get("consumerIdList") or []) if r.code == ResponseCode.SUCCESS and r.body else []


def reset_offsets(namesrv: str, group: str, topic: str, *, to_time: datetime.datetime | int | None = None,
                  to_offset: int | None = None, force: bool = False, access_key: str | None = None,
                  secret_key: str | None = None) -> dict[int, tuple[int, int]]:
    """Set `group`'s offset on every queue of `topic` to the first message stored at or after `to_time`, or
    to `to_offset` (clamped to each queue's range). Returns queue → (old offset, new offset)."""
    validate_group(group)
    validate_topic(topic)
    if (to_time is None) == (to_offset is None):
        raise ValueError("give exactly one of to_time and to_offset")
    with Admin(namesrv, access_key=access_key, secret_key=secret_key) as admin, \
            PullConsumer(namesrv, group, access_key=access_key, secret_key=secret_key) as c:
        members = live_members(admin, group, topic)
        members = [m for m in members if m != c.client_id]
        if members and not force:
            raise GroupOperationError(
                f"group {group} has {len(members)} live member(s) ({', '.join(members)}); they keep their "
                "position in memory and would commit over a reset: stop its workers first, or force")
        out = {}
        for q in c.queues(topic):
            lo, hi = admin.min_offset(topic, q), admin.max_offset(topic, q)
            new = admin.search_offset(topic, q, _ms(to_time)) if to_time is not None else int(to_offset or 0)
            new = min(max(new, lo), hi)
            out[q] = (c.fetch_offset(topic, q), new)
            c.commit_offset(topic, q, new)
        return out


def read_range(namesrv: str, topic: str, *, from_time: datetime.datetime | int | None = None,
               to_time: datetime.datetime | int | None = None, tags: str = "*", access_key: str | None = None,
               secret_key: str | None = None) -> Iterator[MessageExt]:
    """The messages of `topic` stored in [from_time, to_time), queue by queue, each queue in order."""
    lo_ms = _ms(from_time) if from_time is not None else 0
    hi_ms = _ms(to_time) if to_time is not None else None
    if hi_ms is not None and hi_ms <= lo_ms:
        raise ValueError("to_time must be after from_time")
    matcher = MessageFilter(tags)
    with Admin(namesrv, access_key=access_key, secret_key=secret_key) as admin, \
            PullConsumer(namesrv, REPLAY_GROUP, access_key=access_key, secret_key=secret_key) as c:
        for q in c.queues(topic):
            offset = admin.search_offset(topic, q, lo_ms) if lo_ms else admin.min_offset(topic, q)
            end = admin.search_offset(topic, q, hi_ms) if hi_ms is not None else admin.max_offset(topic, q)
            while offset < end:
                r = c.pull(topic, q, offset, min(256, end - offset), 0, tags)
                for m in r.messages:
                    if m.queue_offset < end and (matcher.match_all or matcher.is_matched_by_commit_log(m)):
                        yield m
                if r.status != FOUND or r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset


def replay(namesrv: str, topic: str, handler: Callable[[MessageExt], object], **range_kw: object) -> int:
    """Call `handler` for each message of the range (see `read_range`); returns how many."""
    n = 0
    for m in read_range(namesrv, topic, **range_kw):  # type: ignore[arg-type]
        handler(m)
        n += 1
    return n
