"""`TransactionalMessageCheckService`: half messages nobody ended are asked about.

Every `transaction_check_interval` ms the service walks the half queue from the offset of the check group
`CID_RMQ_SYS_TRANS` (kept in consumerOffset.json, as RocketMQ keeps it). A half message whose transaction
has ended is passed; one younger than `transaction_timeout` (or its `CHECK_IMMUNITY_TIME_IN_SECONDS`) stops
the walk until the next round; one checked `transaction_check_max` times is discarded to
`TRANS_CHECK_MAX_TIME_TOPIC`; any other is re-put with `TRANSACTION_CHECK_TIMES` + 1 and the producer group
is asked, over one live connection of any of its members, with a one-way CHECK_TRANSACTION_STATE carrying
the copy. The producer answers with END_TRANSACTION (`fromTransactionCheck=true`). Messages stored after
the round began are left to the next round, so each open transaction is asked at most once per round.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import TYPE_CHECKING

from ...common import MessageExt
from ...common.properties import (
    PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS,
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TRANSACTION_CHECK_TIMES,
)
from ...common.topic import RMQ_SYS_TRANS_HALF_TOPIC
from ...remoting import RemotingCommand, RequestCode
from .service import CHECK_GROUP, TransactionalMessageService, transaction_id

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger(__name__)

PULL_BATCH = 32


class TransactionalMessageCheckService:
    """The check-back thread (see the module docstring); `check_once` runs one round (tests call it)."""

    def __init__(self, broker: Broker, service: TransactionalMessageService) -> None:
        self.broker = broker
        self.service = service
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._round_lock = threading.Lock()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="TransactionalMessageCheckService", daemon=True)
        self._thread.start()

    def shutdown(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wakeup(self) -> None:
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.broker.config.transaction_check_interval / 1000.0)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.check_once()
            except Exception:
                log.exception("transaction check round failed")

    def check_once(self, now_ms: int | None = None) -> int:
        """One walk of the half queue; the number of producers asked."""
        with self._round_lock:
            return self._check(int(time.time() * 1000) if now_ms is None else now_ms)

    def _check(self, start_ms: int) -> int:
        store = self.broker.store
        offsets = self.broker.offset_manager
        cfg = self.broker.config
        offset = offsets.file.query_offset(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0)
        offset = max(offset, store.get_min_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0), 0)
        asked = 0
        done = False
        while not done and not self._stop.is_set():
            r = store.get_message(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0, offset, PULL_BATCH, None)
            if r is None or not r.messages:
                break
            for half in r.messages:
                if half.store_timestamp >= start_ms:  # stored during this round: the next round's
                    done = True
                    break
                if self.service.outcome(half) is None:
                    if not self._due(half, start_ms, cfg.transaction_timeout):
                        done = True
                        break
                    if int(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES) or 0) >= cfg.transaction_check_max:
                        self.service.discard(half)
                    else:
                        copy = self.service.put_back(half)
                        if copy is None:
                            done = True
                            break
                        asked += self._ask(copy)
                offset = half.queue_offset + 1
            offsets.commit(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0, offset)
        return asked

    def open_halves(self) -> list[MessageExt]:
        """The half messages from the check group's offset on: every transaction that may still be open."""
        store = self.broker.store
        offset = self.broker.offset_manager.file.query_offset(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0)
        offset = max(offset, store.get_min_offset_in_queue(RMQ_SYS_TRANS_HALF_TOPIC, 0), 0)
        out: list[MessageExt] = []
        while True:
            r = store.get_message(CHECK_GROUP, RMQ_SYS_TRANS_HALF_TOPIC, 0, offset, PULL_BATCH, None)
            if r is None or not r.messages:
                return out
            out += r.messages
            offset = r.messages[-1].queue_offset + 1

    @staticmethod
    def _due(half: MessageExt, now_ms: int, timeout_ms: int) -> bool:
        immunity = timeout_ms
        raw = half.properties.get(PROPERTY_CHECK_IMMUNITY_TIME_IN_SECONDS)
        if raw:
            try:
                immunity = max(int(raw) * 1000, timeout_ms)
            except ValueError:
                pass
        age = now_ms - half.born_timestamp
        return age >= immunity or age < 0

    def _ask(self, half: MessageExt) -> int:
        """Send CHECK_TRANSACTION_STATE for `half` to one live member of its producer group."""
        group = half.properties.get(PROPERTY_PRODUCER_GROUP, "")
        channel = self.broker.client_manager.producers.available_channel(group)
        if channel is None:
            log.warning("transaction %s: no live producer of group %r to ask (check %s)", transaction_id(half),
                        group, half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES))
            return 0
        body = self.broker.store.select_one_message_by_offset(half.commit_log_offset) or b""
        cmd = RemotingCommand.request(RequestCode.CHECK_TRANSACTION_STATE, {
            "topic": half.properties.get(PROPERTY_REAL_TOPIC, ""),
            "tranStateTableOffset": half.queue_offset, "commitLogOffset": half.commit_log_offset,
            "msgId": half.uniq_key or half.msg_id, "transactionId": transaction_id(half),
            "offsetMsgId": half.msg_id}, body, oneway=True)
        try:
            channel.send_oneway(cmd)
        except Exception:
            log.warning("transaction %s: asking %s failed", transaction_id(half),
                        getattr(channel, "remote_address", "?"), exc_info=True)
            return 0
        return 1
