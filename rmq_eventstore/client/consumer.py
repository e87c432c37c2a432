"""`PullConsumer`: pulls a queue from an offset with long polling, commits and fetches the group's
offsets on the broker, and sends failed messages back for retry (`DefaultMQPullConsumer` /
`DefaultLitePullConsumer`'s primitives)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ..common import MessageExt
from ..common.filter import MessageFilter
from ..common.topic import RETRY_GROUP_TOPIC_PREFIX, validate_group
from ..remoting import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from .base import ClientBase, decode_records
from .remoting_client import RemotingError

FOUND = "FOUND"
NO_NEW_MSG = "NO_NEW_MSG"
NO_MATCHED_MSG = "NO_MATCHED_MSG"
OFFSET_ILLEGAL = "OFFSET_ILLEGAL"
_PULL_STATUS = {
    ResponseCode.SUCCESS: FOUND,
    ResponseCode.PULL_NOT_FOUND: NO_NEW_MSG,
    ResponseCode.PULL_RETRY_IMMEDIATELY: NO_MATCHED_MSG,
    ResponseCode.PULL_OFFSET_MOVED: OFFSET_ILLEGAL,
}
DEFAULT_SUSPEND_TIMEOUT_MS = 20_000  # brokerSuspendMaxTimeMillis


@dataclass
class PullResult:
    """`PullResult`: status (FOUND, NO_NEW_MSG, NO_MATCHED_MSG, OFFSET_ILLEGAL), where to pull next,
    the queue's offset range, and the messages (already filtered by tag, as Java's client does)."""

    status: str
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[MessageExt] = field(default_factory=list)


class PullConsumer:
    """Pull-style consumer of one group; thread-safe (several threads may pull different queues)."""

    def __init__(self, namesrv_addr: str, group: str, timeout_ms: int = 3000,
                 message_model: str = "CLUSTERING", access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        validate_group(group)
        self.group = group
        self.message_model = message_model
        self._subs: dict[str, str] = {}
        self._subs_lock = threading.Lock()
        self._filters: dict[str, MessageFilter] = {}  # expression -> its parsed filter (read-only, shared)
        self._base = self._make_base(namesrv_addr, timeout_ms / 1000.0, access_key, secret_key)

    def _make_base(self, namesrv_addr: str, timeout: float, access_key: str | None,
                   secret_key: str | None) -> _ConsumerBase:
        return _ConsumerBase(namesrv_addr, self, timeout, access_key, secret_key)

    @property
    def client_id(self) -> str:
        return self._base.client_id

    def start(self) -> PullConsumer:
        self._base.start()
        return self

    def shutdown(self) -> None:
        self._base.shutdown()

    def __enter__(self) -> PullConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def subscribe(self, topic: str, expression: str = "*") -> None:
        """Register interest in a topic (sent with heartbeats; the broker lists us as a group member)."""
        with self._subs_lock:
            changed = self._subs.get(topic) != expression
            self._subs[topic] = expression
        if changed:
            self._base.send_heartbeat([self._base.broker_for(topic)])

    def subscriptions(self) -> dict[str, str]:
        with self._subs_lock:
            return dict(self._subs)

    def queues(self, topic: str) -> list[int]:
        """The readable queue ids of a topic."""
        return sorted({q for _, q in self._base.route(topic).read_queues})

    def pull(self, topic: str, queue_id: int, offset: int, max_nums: int = 32,
             suspend_timeout_ms: int = DEFAULT_SUSPEND_TIMEOUT_MS, expression: str = "*",
             commit_offset: int | None = None) -> PullResult:
        """Pull up to `max_nums` messages from `offset`. With `suspend_timeout_ms` > 0 the broker holds
        the request until a message arrives or the time is up (long polling); 0 answers at once.
        `commit_offset`, when given, is committed for the group in the same request."""
        if topic not in self._subs:
            try:
                self.subscribe(topic, expression)
            except RemotingError:
                pass
        addr = self._base.broker_for(topic)
        sys_flag = PULL_FLAG_SUBSCRIPTION
        if suspend_timeout_ms > 0:
            sys_flag |= PULL_FLAG_SUSPEND
        if commit_offset is not None:
            sys_flag |= PULL_FLAG_COMMIT_OFFSET
        cmd = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": self.group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": commit_offset or 0,
            "suspendTimeoutMillis": max(suspend_timeout_ms, 0), "subscription": expression, "subVersion": 0,
            "expressionType": "TAG"})
        timeout = self._base.timeout + max(suspend_timeout_ms, 0) / 1000.0
        r = self._base.invoke(addr, cmd, timeout, ok=tuple(_PULL_STATUS))
        x = r.ext_fields
        msgs = decode_records(r.body) if r.code == ResponseCode.SUCCESS and r.body else []
        if msgs and expression != "*":
            f = self._filters.get(expression)
            if f is None:
                if len(self._filters) >= 256:
                    self._filters.clear()
                f = self._filters[expression] = MessageFilter(expression)  # parsed once per expression
            if not f.match_all:
                msgs = [m for m in msgs if f.is_matched_by_commit_log(m)]
        return PullResult(_PULL_STATUS[r.code], int(x.get("nextBeginOffset", offset)), int(x.get("minOffset", 0)),
                          int(x.get("maxOffset", 0)), msgs)

    def commit_offset(self, topic: str, queue_id: int, offset: int) -> None:
        """Store the group's next offset for a queue on the broker (UPDATE_CONSUMER_OFFSET)."""
        self._base.invoke(self._base.broker_for(topic), RemotingCommand.request(
            RequestCode.UPDATE_CONSUMER_OFFSET, {"consumerGroup": self.group, "topic": topic, "queueId": queue_id,
                                                 "commitOffset": offset}))

    def fetch_offset(self, topic: str, queue_id: int) -> int:
        """The group's committed offset for a queue (0 for a new group on a queue that starts at 0),
        or -1 when the broker has none (QUERY_CONSUMER_OFFSET)."""
        r = self._base.invoke(self._base.broker_for(topic), RemotingCommand.request(
            RequestCode.QUERY_CONSUMER_OFFSET, {"consumerGroup": self.group, "topic": topic, "queueId": queue_id}),
            ok=(ResponseCode.SUCCESS, ResponseCode.QUERY_NOT_FOUND))
        return int(r.ext_fields.get("offset", -1)) if r.code == ResponseCode.SUCCESS else -1

    def send_back(self, msg: MessageExt, delay_level: int = 0, max_reconsume_times: int = 16) -> None:
        """Hand a message the group failed to process back to the broker (CONSUMER_SEND_MSG_BACK): it
        returns in `%RETRY%<group>` after a delay (level 3 + reconsume times by default), or goes to
        `%DLQ%<group>` after `max_reconsume_times` attempts (or at once with `delay_level` < 0)."""
        addr = self._base.broker_for(msg.topic)
        self._base.invoke(addr, RemotingCommand.request(RequestCode.CONSUMER_SEND_MSG_BACK, {
            "offset": msg.commit_log_offset, "group": self.group, "delayLevel": delay_level,
            "originMsgId": msg.client_msg_id, "originTopic": msg.get_property("RETRY_TOPIC") or msg.topic,
            "unitMode": False, "maxReconsumeTimes": max_reconsume_times}))

    @property
    def retry_topic(self) -> str:
        return RETRY_GROUP_TOPIC_PREFIX + self.group


class _ConsumerBase(ClientBase):
    def __init__(self, namesrv_addr: str, consumer: PullConsumer, timeout: float, access_key: str | None = None,
                 secret_key: str | None = None) -> None:
        super().__init__(namesrv_addr, timeout, access_key, secret_key)
        self.consumer = consumer

    def heartbeat_data(self) -> dict:
        subs = [{"topic": t, "subString": e, "classFilterMode": False, "tagsSet": [], "codeSet": [],
                 "subVersion": 0, "expressionType": "TAG"} for t, e in self.consumer.subscriptions().items()]
        return {"clientID": self.client_id, "producerDataSet": [], "consumerDataSet": [{
            "groupName": self.consumer.group, "consumeType": "CONSUME_ACTIVELY",
            "messageModel": self.consumer.message_model, "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": subs, "unitMode": False}]}

    def _unregister(self) -> None:
        for addr in self._known_brokers():
            try:
                self.remoting.invoke(addr, RemotingCommand.request(RequestCode.UNREGISTER_CLIENT, {
                    "clientID": self.client_id, "consumerGroup": self.consumer.group}), 1.0)
            except RemotingError:
                pass
