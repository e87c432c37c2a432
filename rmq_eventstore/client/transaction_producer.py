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
from .base import ClientBase, decode_records
from .producer import (
    _OK_CODES,
    _SEND_V2,
    _VALID_TOPICS_MAX,
    OPAQUES,
    Producer,
    SendResult,
    _ProducerBase,
    _send_frame,
    _send_take,
    _uniq_create,
)
from .remoting_client import MQBrokerError, RemotingError, RemotingTimeoutError

log = logging.getLogger(__name__)


class TransactionState(enum.Enum):
    """`LocalTransactionState`: what the local transaction decided."""

    COMMIT = "COMMIT_MESSAGE"
    ROLLBACK = "ROLLBACK_MESSAGE"
    UNKNOWN = "UNKNOW"


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
        self._half_extra: str | None = None  # the half message's TRAN_MSG and PGROUP properties, as text
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
        sys_flag = (msg.sys_flag & ~codec.TRANSACTION_ROLLBACK_TYPE) | codec.TRANSACTION_PREPARED_TYPE
        sent = None
        given = msg.properties
        if (stream is None and _send_frame is not None and msg.__class__ is Message and msg.properties_string is None
                and not msg.queue_id and msg.body.__class__ is bytes
                and (not given or (PROPERTY_TRANSACTION_PREPARED not in given and PROPERTY_PRODUCER_GROUP not in given))):
            queues = self._cached_queues(topic)
            if queues is not None:  # the usual half message: its frame in C, as `send`'s plain case
                sent = self._prepare_plain(msg, uniq, sys_flag, queues, while_waiting)
        if sent is None:
            props, uniq = self._half_properties(msg, uniq)
            sent = self._send(topic, msg.queue_id or None, _SEND_V2, bytes(msg.body), props, msg.flag, sys_flag,
                              msg.reconsume_times, uniq, False, None, stream, expected_version, while_waiting)
        return TransactionSendResult(sent.status, sent.msg_id, sent.offset_msg_id, sent.queue_id,
                                     sent.queue_offset, sent.topic, sent.broker_address, sent.stream_version,
                                     uniq, TransactionState.UNKNOWN)

    def _half_properties(self, msg: Message, uniq: str) -> tuple[str, str]:
        """The properties string of `msg` as a half message (`send`'s, then TRAN_MSG and PGROUP set) and its
        UNIQ_KEY: the definition of the bytes `_prepare_plain`'s C frame carries."""
        props, uniq = self._properties(msg, uniq, 0)
        props = set_property(props, PROPERTY_TRANSACTION_PREPARED, "true")
        return set_property(props, PROPERTY_PRODUCER_GROUP, self.group), uniq

    def _prepare_plain(self, msg: Message, uniq: str, sys_flag: int, queues: list[tuple[str, int]],
                       while_waiting: Callable[[], None] | None) -> SendResult | None:
        """`prepare`'s usual case (a Message with neither a properties string nor TRAN_MSG / PGROUP among its
        properties, no stream, the route cached): the request frame made in one C call (`client_send_frame`
        with the half message's two properties and flag), written straight to the connection; the same pick,
        bytes, `while_waiting` and result as `_send`. None (nothing sent) when the C frame declines the message;
        a failed first attempt goes on in `_send`, as `send`'s plain case does."""
        addr, q = queues[next(self._rr) % len(queues)]  # `_pick`'s round robin, nothing to avoid
        opaque = next(OPAQUES) & 0x7FFFFFFF
        extra = self._half_extra
        if extra is None:
            extra = self._half_extra = f"{PROPERTY_TRANSACTION_PREPARED}\x01true\x02{PROPERTY_PRODUCER_GROUP}\x01{self.group}\x02"
        frame = _send_frame(msg, uniq, self.group, q, opaque, None, extra, sys_flag)  # type: ignore[misc]
        if frame is None:
            return None
        work = [while_waiting] if while_waiting is not None else []

        def run_once() -> None:
            if work:
                work.pop()()

        base = self._base
        topic = msg.topic
        try:
            remoting = base.remoting
            conn = remoting._conns.get(addr)
            if conn is None or conn.closed:
                conn = remoting.connection(addr)
            r = conn.invoke_frame(frame, opaque, _SEND_V2, base.timeout, _send_take, run_once if work else None)
        except RemotingError as e:
            if isinstance(e, RemotingTimeoutError):
                raise  # the call's timeout is spent; a half sent again could be committed twice (`_send`)
            if self.retry_times_when_send_failed > 0:
                base.route(topic, refresh=True)
            props, uniq = self._half_properties(msg, uniq)
            return self._send(topic, None, _SEND_V2, msg.body, props, msg.flag, sys_flag, msg.reconsume_times, uniq,
                              False, None, None, None, run_once if work else None, failed=(addr, e))
        if r.__class__ is tuple:  # a SUCCESS response read in C: (msgId, queue id or None, queue offset)
            return SendResult("SEND_OK", uniq, r[0], q if r[1] is None else r[1], r[2], topic, addr, None)
        if r.code not in _OK_CODES:
            raise MQBrokerError(r.code, r.remark, addr)
        return self._result(r, q, uniq, topic, addr, None, None)

    def end_transaction(self, sent: TransactionSendResult, state: TransactionState,
                        error: BaseException | None = None, *, offset: int | None = None) -> None:
        """End a prepared transaction: COMMIT makes the message visible, ROLLBACK drops it, UNKNOWN leaves it
        to the check-back. A lost END_TRANSACTION is logged, not raised: the check-back settles it.
        `offset`: the half message's commit log offset, when the caller decoded `sent.offset_msg_id` already."""
        sent.local_transaction_state = state
        if sent.status != "SEND_OK":
            return
        try:
            if offset is None:
                self._end(sent.broker_address, sent.offset_msg_id, sent.queue_offset, sent.transaction_id, state,
                          False, error, sent.topic)
            else:
                self._end_at(sent.broker_address, offset, sent.queue_offset, sent.transaction_id, state, False,
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
                  "fromTransactionCheck": "true" if from_check else "false", "msgId": txid, "transactionId": txid}
        # (the flag as the text request() would make of it: every value a str or an int, the C builder's case)
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
