"""`TransactionProducer`: RocketMQ's transactional messages from the producer's side
(`TransactionMQProducer` / `DefaultMQProducerImpl.sendMessageInTransaction`).

`send_in_transaction(msg, execute)` sends `msg` as a half message (property `TRAN_MSG=true`, the producer
group in `PGROUP`, the PREPARED sysFlag), runs `execute(msg)` (the local transaction: a database commit,
say), and ends the transaction with its answer: COMMIT makes the message visible on its topic, ROLLBACK
drops it, UNKNOWN (or an exception in `execute`) leaves it to the broker, which after
`transaction_timeout` asks a live member of the producer group: `checker(msg)` answers, on a worker thread,
with the same three states. Any process of the group can answer, so a transaction whose sender died is
still settled.

Embedded use: run the broker in the same process (`rmq_eventstore.broker.serve_in_thread`) and point the
producer at its name server; the checker is then called in-process.
"""

from __future__ import annotations

import concurrent.futures
import enum
import logging
from collections.abc import Callable
from dataclasses import dataclass

from ..common import Message, MessageExt, codec
from ..common.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_TRANSACTION_PREPARED,
    set_property,
)
from ..common.topic import validate_topic
from ..remoting import RemotingCommand, RequestCode
from ..remoting.command import OPAQUES
from .base import ROUTE_TTL_SECONDS, ClientBase, decode_records
from .producer import (
    _FAST_BASES,
    _OK_CODES,
    _SEND_V2,
    _VALID_TOPICS_MAX,
    Producer,
    SendResult,
    _fast_base,
    _monotonic,
    _native,
    _ProducerBase,
    _send_take,
    _uniq_create,
)
from .remoting_client import MQBrokerError, RemotingError

log = logging.getLogger(__name__)


class TransactionState(enum.Enum):
    """`LocalTransactionState`: what the local transaction decided."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


# the half message's request frame in one C call (THE HALF LANE in _native.c); None without the native core (or
# under RMQ_EVENTSTORE_PURE=1): `prepare`'s general path, the definition of the bytes (tests/test_half_lane_client.py)
_half_frame = getattr(_native, "client_half_frame", None) if _native is not None else None
_END_TYPE = {TransactionState.COMMIT: codec.TRANSACTION_COMMIT_TYPE,
             TransactionState.ROLLBACK: codec.TRANSACTION_ROLLBACK_TYPE,
             TransactionState.UNKNOWN: codec.TRANSACTION_NOT_TYPE}


@dataclass
class TransactionSendResult(SendResult):
    """The half message's `SendResult` plus the transaction id and what the local transaction decided."""

    transaction_id: str = ""
    local_transaction_state: TransactionState = TransactionState.UNKNOWN


Checker = Callable[[MessageExt], TransactionState]
Executor = Callable[[Message], TransactionState]


class _TransactionProducerBase(_ProducerBase):
    """Answers the broker's CHECK_TRANSACTION_STATE requests through the producer's checker."""

    producer: TransactionProducer

    def _on_server_request(self, address: str, cmd: RemotingCommand) -> None:
        if cmd.code == RequestCode.CHECK_TRANSACTION_STATE:
            self.producer._check(address, cmd)


class TransactionProducer(Producer):
    """A `Producer` that also sends transactional messages (see the module docstring); thread-safe."""

    def __init__(self, namesrv_addr: str, group: str, checker: Checker, check_threads: int = 4,
                 **kwargs: object) -> None:
        if not callable(checker):
            raise TypeError("checker must be a callable taking the half message and returning a TransactionState")
        self.checker = checker
        self._check_pool = concurrent.futures.ThreadPoolExecutor(check_threads, f"tx-check-{group}")
        super().__init__(namesrv_addr, group, **kwargs)  # type: ignore[arg-type]

    def _make_base(self, namesrv_addr: str, timeout: float, access_key: str | None,
                   secret_key: str | None) -> ClientBase:
        return _TransactionProducerBase(namesrv_addr, self, timeout, access_key, secret_key)

    def start(self) -> TransactionProducer:
        """Start and announce the producer group to every broker of the cluster, so any of them can ask it
        about a half message (even one sent by another, crashed, member of the group)."""
        super().start()
        try:
            self._base.pin_cluster()
        except RemotingError as e:
            log.warning("could not announce producer group %s to the cluster yet: %s", self.group, e)
        return self

    def shutdown(self) -> None:
        super().shutdown()
        self._check_pool.shutdown(wait=False, cancel_futures=True)

    def send_in_transaction(self, msg: Message, execute: Executor, *, stream: str | None = None,
                            expected_version: int | None = None) -> TransactionSendResult:
        """Send `msg` as a half message, run `execute(msg)`, end the transaction with its answer.

        With `stream` (and `expected_version`), the message is the stream's next event as in
        `Producer.send`; the version is reserved while the transaction is open and the stream takes no
        other append until it ends (a conflict raises `ConcurrencyError` before `execute` runs)."""
        sent = self.prepare(msg, stream=stream, expected_version=expected_version)
        state = TransactionState.ROLLBACK
        error: BaseException | None = None
        if sent.status == "SEND_OK":
            try:
                state = execute(msg)
                if not isinstance(state, TransactionState):
                    raise TypeError(f"execute returned {state!r}, not a TransactionState")
            except Exception as e:  # the local transaction failed or did not say: the check-back decides
                log.warning("local transaction of %s raised %s: %s; its state is UNKNOWN", sent.transaction_id,
                            type(e).__name__, e)
                state, error = TransactionState.UNKNOWN, e
        self.end_transaction(sent, state, error)
        return sent

    def prepare(self, msg: Message, *, stream: str | None = None, expected_version: int | None = None,
                while_waiting: Callable[[], None] | None = None) -> TransactionSendResult:
        """The first half of `send_in_transaction`: store `msg` as a half message (invisible until its end)
        and return its result, whose `transaction_id` is the message's UNIQ_KEY (`msg.uniq_key` when set,
        so a caller can record the id before sending). End it with `end_transaction`; if nobody does, the
        broker asks the group's checker. `while_waiting` (which must not raise) runs once on this thread
        after the request is written and before its answer is read: the caller's own I/O (e.g. recording
        the transaction in its database) overlaps the round trip. It does not run when no request could be
        written."""
        topic = msg.topic
        if topic.__class__ is not str or topic not in self._valid_topics:  # as `send`: each name checked once
            validate_topic(topic)
            if len(self._valid_topics) >= _VALID_TOPICS_MAX:
                self._valid_topics.clear()
            self._valid_topics.add(topic)
        ids = self._ids
        uniq = msg.uniq_key or (_uniq_create is not None and _uniq_create(ids)) or ids.create()
        if (stream is None and _half_frame is not None and msg.__class__ is Message and msg.properties_string is None
                and not msg.queue_id and msg.body.__class__ is bytes):
            sent = self._prepare_plain(msg, uniq, while_waiting)
            if sent is not None:
                return sent
        props, uniq = self._properties(msg, uniq, 0)
        props = set_property(props, PROPERTY_TRANSACTION_PREPARED, "true")
        props = set_property(props, PROPERTY_PRODUCER_GROUP, self.group)
        q = msg.queue_id or None
        sys_flag = (msg.sys_flag & ~codec.TRANSACTION_ROLLBACK_TYPE) | codec.TRANSACTION_PREPARED_TYPE
        sent = self._send(msg.topic, q, RequestCode.SEND_MESSAGE_V2, bytes(msg.body), props, msg.flag, sys_flag,
                          msg.reconsume_times, uniq, False, None, stream, expected_version, while_waiting)
        return TransactionSendResult(sent.status, sent.msg_id, sent.offset_msg_id, sent.queue_id,
                                     sent.queue_offset, sent.topic, sent.broker_address, sent.stream_version,
                                     uniq, TransactionState.UNKNOWN)

    def _prepare_plain(self, msg: Message, uniq: str,
                       while_waiting: Callable[[], None] | None) -> TransactionSendResult | None:
        """`prepare`'s usual case, as `Producer.send`'s plain path: the request frame in one C call
        (`_native.client_half_frame`: the bytes the general path writes), written to the connection directly,
        the round-robin queue `_pick` gives. None, nothing done, when the route is not cached and fresh, requests
        are signed, or the client base is not ClientBase's: `prepare` goes on. A frame C declines (odd field
        types, a TRAN_MSG or PGROUP property given) or a failed request goes on in `_send` from where it stands,
        `while_waiting` run once in all."""
        base = self._base
        fast = _FAST_BASES.get(base.__class__)
        if not (fast or (fast is None and _fast_base(base.__class__))):
            return None
        topic = msg.topic
        route = base._routes.get(topic)
        if (route is None or not route.queues or _monotonic() - route.fetched >= ROUTE_TTL_SECONDS
                or base.remoting._sign is not None):
            return None
        queues = route.queues
        addr, q = queues[next(self._rr) % len(queues)]  # _pick's round-robin choice (nothing to avoid)
        opaque = next(OPAQUES) & 0x7FFFFFFF
        frame = _half_frame(msg, uniq, self.group, q, opaque, None)  # type: ignore[misc]
        work = [while_waiting] if while_waiting is not None else None
        failed = None
        if frame is not None:
            remoting = base.remoting
            try:
                conn = remoting._conns.get(addr)
                if conn is None or conn.closed:
                    conn = remoting.connection(addr)
                if work is None:
                    r = conn.invoke_frame(frame, opaque, _SEND_V2, base.timeout, _send_take)
                else:
                    r = conn.invoke_frame_waiting(frame, opaque, _SEND_V2, base.timeout, lambda: work.pop()(),
                                                  _send_take)
            except RemotingError as e:
                if self.retry_times_when_send_failed > 0:
                    base.route(topic, refresh=True)
                failed = (addr, e)
            else:
                if r.__class__ is tuple:  # a SUCCESS response: (msgId, queue id or None, queue offset)
                    return TransactionSendResult("SEND_OK", uniq, r[0], q if r[1] is None else r[1], r[2], topic,
                                                 addr, None, uniq, TransactionState.UNKNOWN)
                if r.code not in _OK_CODES:
                    raise MQBrokerError(r.code, r.remark, addr)
                return self._half_result(self._result(r, q, uniq, topic, addr, None, None), uniq)
        props, uniq = self._properties(msg, uniq, 0)
        props = set_property(props, PROPERTY_TRANSACTION_PREPARED, "true")
        props = set_property(props, PROPERTY_PRODUCER_GROUP, self.group)
        sys_flag = (msg.sys_flag & ~codec.TRANSACTION_ROLLBACK_TYPE) | codec.TRANSACTION_PREPARED_TYPE
        run_once = (lambda: work.pop()() if work else None) if work is not None else None
        sent = self._send(topic, None, _SEND_V2, msg.body, props, msg.flag, sys_flag, msg.reconsume_times, uniq,
                          False, None, None, None, run_once, picked=None if failed else (addr, q), failed=failed)
        return self._half_result(sent, uniq)

    @staticmethod
    def _half_result(sent: SendResult, uniq: str) -> TransactionSendResult:
        return TransactionSendResult(sent.status, sent.msg_id, sent.offset_msg_id, sent.queue_id,
                                     sent.queue_offset, sent.topic, sent.broker_address, sent.stream_version,
                                     uniq, TransactionState.UNKNOWN)

    def end_transaction(self, sent: TransactionSendResult, state: TransactionState,
                        error: BaseException | None = None) -> None:
        """End a prepared transaction: COMMIT makes the message visible, ROLLBACK drops it, UNKNOWN leaves it
        to the check-back. A lost END_TRANSACTION is logged, not raised: the check-back settles it."""
        sent.local_transaction_state = state
        if sent.status != "SEND_OK":
            return
        try:
            self._end(sent.broker_address, sent.offset_msg_id, sent.queue_offset, sent.transaction_id, state, False,
                      error, sent.topic)
        except RemotingError as e:  # the broker will ask
            log.warning("END_TRANSACTION for %s not delivered (%s); the broker's check-back settles it",
                        sent.transaction_id, e)

    def _end(self, address: str, offset_msg_id: str, queue_offset: int, txid: str, state: TransactionState,
             from_check: bool, error: BaseException | None = None, topic: str | None = None) -> None:
        _, _, commit_log_offset = codec.decode_message_id(offset_msg_id)
        self._end_at(address, commit_log_offset, queue_offset, txid, state, from_check, error, topic)

    def _end_at(self, address: str, commit_log_offset: int, queue_offset: int, txid: str, state: TransactionState,
                from_check: bool, error: BaseException | None = None, topic: str | None = None) -> None:
        header = {"topic": topic, "producerGroup": self.group, "tranStateTableOffset": queue_offset,
                  "commitLogOffset": commit_log_offset, "commitOrRollback": _END_TYPE[state],
                  "fromTransactionCheck": "true" if from_check else "false",  # a str: the C request builder's
                  "msgId": txid, "transactionId": txid}
        cmd = RemotingCommand.request(RequestCode.END_TRANSACTION, header, oneway=True)
        if error is not None:
            cmd.remark = f"executeLocalTransactionBranch exception: {type(error).__name__}: {error}"[:512]
        self._base.remoting.invoke_oneway(address, cmd)

    def _check(self, address: str, cmd: RemotingCommand) -> None:
        """A CHECK_TRANSACTION_STATE from the broker at `address`: ask the checker on a worker thread."""
        try:
            msgs = decode_records(cmd.body)
        except Exception:
            log.warning("CHECK_TRANSACTION_STATE from %s with an undecodable body", address, exc_info=True)
            return
        if not msgs:
            return
        half = msgs[0]
        if half.properties.get(PROPERTY_PRODUCER_GROUP) not in (None, self.group):
            log.warning("CHECK_TRANSACTION_STATE for group %s reached %s", half.properties.get(PROPERTY_PRODUCER_GROUP),
                        self.group)
            return
        txid = cmd.get_str("transactionId", None) or half.uniq_key or half.msg_id
        offset = cmd.get_int("commitLogOffset", half.commit_log_offset)
        queue_offset = cmd.get_int("tranStateTableOffset", half.queue_offset)

        def run() -> None:
            try:
                state = self.checker(half)
                if not isinstance(state, TransactionState):
                    raise TypeError(f"checker returned {state!r}, not a TransactionState")
            except Exception:
                log.exception("transaction checker failed for %s; answering UNKNOWN", txid)
                state = TransactionState.UNKNOWN
            try:
                self._end_at(address, offset, queue_offset, txid, state, True, None,
                             cmd.get_str("topic", None) or half.properties.get("REAL_TOPIC"))
            except RemotingError as e:
                log.warning("answer to the check of %s not delivered: %s", txid, e)

        try:
            self._check_pool.submit(run)
        except RuntimeError:  # shutting down
            pass
