"""Pulls (`PullMessageProcessor`): PULL_MESSAGE with tag filters, offset commits and long polling."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...common import GetMessageStatus
from ...common.filter import MessageFilter
from ...common.topic_config import PermName
from ...remoting import (
    PULL_FLAG_COMMIT_OFFSET,
    PULL_FLAG_SUBSCRIPTION,
    PULL_FLAG_SUSPEND,
    RemotingCommand,
    RequestCode,
    ResponseCode,
)
from ..config import MASTER_ID
from ..long_polling import PullHold

if TYPE_CHECKING:
    from ..broker import Broker


class PullMessageProcessor:
    """Pulls by queue offset; a pull that finds nothing and may wait becomes a `PullHold`."""

    CODES = (RequestCode.PULL_MESSAGE,)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self._filters: dict[str, MessageFilter] = {}  # expression -> its parsed filter (read-only, shared)

    def _filter(self, expression: str) -> MessageFilter:
        f = self._filters.get(expression)
        if f is None:
            if len(self._filters) >= 4096:
                self._filters.clear()
            f = self._filters[expression] = MessageFilter(expression)
        return f

    def process(self, req: RemotingCommand, channel: Any, allow_suspend: bool = True) -> RemotingCommand | PullHold:
        """`PullMessageProcessor.processRequest`."""
        group = req.get_str("consumerGroup")
        topic = req.get_str("topic")
        queue_id = req.get_int("queueId")
        offset = req.get_int("queueOffset")
        max_nums = req.get_int("maxMsgNums")
        sys_flag = req.get_int("sysFlag", 0)
        commit_offset = req.get_int("commitOffset", 0)
        suspend_ms = req.get_int("suspendTimeoutMillis", 0)
        if max_nums <= 0:
            max_nums = 1
        max_nums = min(max_nums, self.broker.config.max_pull_msg_nums)
        sg = self.broker.group_manager.find(group)
        if sg is None:
            return req.response(ResponseCode.SUBSCRIPTION_GROUP_NOT_EXIST,
                                f"subscription group [{group}] does not exist")
        if not sg.consume_enable:
            return req.response(ResponseCode.NO_PERMISSION, f"subscription group no permission, {group}")
        tc = self.broker.topic_manager.get(topic)
        if tc is None:
            tc = self.broker.topic_manager.auto_topic(topic)  # a consumer may start before the first send creates the topic
            if tc is None:
                return req.response(ResponseCode.TOPIC_NOT_EXIST, f"topic[{topic}] not exist, apply first please!")
        if not PermName.is_readable(tc.perm):
            return req.response(ResponseCode.NO_PERMISSION, f"the topic[{topic}] pulling message is forbidden")
        if queue_id < 0 or queue_id >= tc.read_queue_nums:
            return req.response(ResponseCode.SYSTEM_ERROR,
                                f"queueId[{queue_id}] is illegal, topic:[{topic}] topicConfig.readQueueNums:"
                                f"[{tc.read_queue_nums}] consumer:[{getattr(channel, 'remote_address', '')}]")
        if sys_flag & PULL_FLAG_SUBSCRIPTION:
            expr_type = req.get_str("expressionType", "TAG") or "TAG"
            if expr_type.upper() != "TAG":
                return req.response(ResponseCode.SUBSCRIPTION_PARSE_FAILED,
                                    f"The broker does not support consumer to filter message by {expr_type}")
            expression = req.get_str("subscription", "*")
        else:
            expression = self.broker.client_manager.consumers.subscription(group, topic)
            if expression is None:
                return req.response(ResponseCode.SUBSCRIPTION_NOT_EXIST,
                                    f"the consumer's subscription not exist, group: {group} topic: {topic}")
        r = self.broker.store.get_message(group, topic, queue_id, offset, max_nums, self._filter(expression))
        if r is None:
            return req.response(ResponseCode.SYSTEM_ERROR, "store getMessage return null")
        ext = {"nextBeginOffset": r.next_begin_offset, "minOffset": r.min_offset, "maxOffset": r.max_offset,
               "suggestWhichBrokerId": MASTER_ID}
        st = r.status
        body = b""
        if st == GetMessageStatus.FOUND:
            code = ResponseCode.SUCCESS
            body = r.body
        elif st in (GetMessageStatus.MESSAGE_WAS_REMOVING, GetMessageStatus.NO_MATCHED_MESSAGE):
            code = ResponseCode.PULL_RETRY_IMMEDIATELY
        elif st in (GetMessageStatus.NO_MATCHED_LOGIC_QUEUE, GetMessageStatus.NO_MESSAGE_IN_QUEUE):
            code = ResponseCode.PULL_OFFSET_MOVED if offset != 0 else ResponseCode.PULL_NOT_FOUND
        elif st in (GetMessageStatus.OFFSET_FOUND_NULL, GetMessageStatus.OFFSET_OVERFLOW_ONE):
            code = ResponseCode.PULL_NOT_FOUND
        else:  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL, OFFSET_RESET
            code = ResponseCode.PULL_OFFSET_MOVED
        if allow_suspend and sys_flag & PULL_FLAG_COMMIT_OFFSET:
            self.broker.offset_manager.commit(group, topic, queue_id, commit_offset)
        if code == ResponseCode.PULL_NOT_FOUND and allow_suspend and sys_flag & PULL_FLAG_SUSPEND:
            timeout = suspend_ms if self.broker.config.long_polling_enable else self.broker.config.short_polling_time_mills
            timeout = max(0, min(timeout, self.broker.config.max_suspend_timeout_mills))
            if timeout > 0:
                return PullHold(req, topic, queue_id, offset, timeout)
        return req.response(code, None if code == ResponseCode.SUCCESS else st.name, ext, body)

    def pull_blocking(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int = 32,
                      expression: str = "*", suspend_timeout_ms: int = 0) -> RemotingCommand:
        """In-process pull with long polling (blocks the calling thread up to `suspend_timeout_ms`)."""
        sys_flag = PULL_FLAG_SUBSCRIPTION | (PULL_FLAG_SUSPEND if suspend_timeout_ms > 0 else 0)
        req = RemotingCommand.request(RequestCode.PULL_MESSAGE, {
            "consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
            "maxMsgNums": max_nums, "sysFlag": sys_flag, "commitOffset": 0,
            "suspendTimeoutMillis": suspend_timeout_ms, "subscription": expression, "subVersion": 0})
        r = self.process(req, None)
        if isinstance(r, PullHold):
            ev = threading.Event()
            handle = self.wait_for_arrival(r, ev.set)
            try:
                ev.wait(r.timeout_ms / 1000.0)
            finally:
                self.broker.hold_service.cancel(handle)
            r = self.process(req, None, allow_suspend=False)
        assert isinstance(r, RemotingCommand)
        return r

    def wait_for_arrival(self, hold: PullHold, wake: Callable[[], None]) -> tuple:
        """Register `wake` for the held pull; returns a handle for `hold_service.cancel`. Calls `wake`
        at once if a message arrived between the pull and this registration."""
        handle = self.broker.hold_service.hold(hold.topic, hold.queue_id, hold.offset, wake)
        if self.broker.store.get_max_offset_in_queue(hold.topic, hold.queue_id) > hold.offset:
            self.broker.hold_service.cancel(handle)
            wake()
        return handle
