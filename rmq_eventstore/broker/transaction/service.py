"""Half messages and their ends, as RocketMQ 5's `TransactionalMessageBridge`, `TransactionalMessageServiceImpl`
and `EndTransactionProcessor` keep them, with one addition: an end is idempotent per transaction.

* `prepare` turns a message sent with `TRAN_MSG=true` into a half message: topic `RMQ_SYS_TRANS_HALF_TOPIC`
  queue 0, the real topic and queue kept as `REAL_TOPIC` / `REAL_QID`, the transaction bits of the sysFlag
  cleared. Dispatch puts it in the half topic's consume queue and its keys under the half topic in the index,
  so no read path of the real topic (pull, POP, query by key or id on the topic, Spark's topic filter) sees it.
* `end` commits (a NEW record on the real topic with the COMMIT sysFlag, `TRAN_PREPARED_QUEUE_OFFSET` set,
  `REAL_*` removed) and then writes an op message (topic `RMQ_SYS_TRANS_OP_HALF_TOPIC`, tag `d`, body the
  half queue offset as decimal text), or for a rollback writes the op message only.

RocketMQ identifies an end by the half message's offsets, and the check service re-puts an unresolved half
message as a new copy before every check-back, so a late end for the original and the check-back's end for
the copy can both commit. Here an end is decided per transaction id (the half message's UNIQ_KEY, which the
copy keeps): the committed record carries it (indexed as `<real topic>#<id>`, written atomically with the
commit) and the op message carries it as its key. Before committing, the service looks for either (recent
ends in memory, older ones through the index), so a repeated, late or crossing end changes nothing. A crash
between the commit and its op message leaves the commit findable; the next end only writes the op message.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...common import Message, MessageExt, codec
from ...common.properties import (
    PROPERTY_PRODUCER_GROUP,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_STREAM_ID,
    PROPERTY_TRANSACTION_CHECK_TIMES,
    PROPERTY_TRANSACTION_ID,
    PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET,
    delete_properties,
    get_property,
    set_property,
)
from ...common.topic import (
    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
)
from ...common.topic_config import PermName
from ...remoting import ResponseCode

if TYPE_CHECKING:
    from ...store import PutMessageResult
    from ..broker import Broker

log = logging.getLogger(__name__)

REMOVE_TAG = "d"  # TransactionalMessageUtil.REMOVETAG
CHECK_GROUP = "CID_RMQ_SYS_TRANS"  # TransactionalMessageUtil.buildConsumerGroup()
COMMIT, ROLLBACK, DISCARDED = "COMMIT", "ROLLBACK", "DISCARDED"
RECENT_ENDS = 200_000  # transaction outcomes remembered in memory (older ones are found in the index)
_COMMIT_DROPPED = (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QUEUE_ID, PROPERTY_TRANSACTION_CHECK_TIMES)  # not on a commit
_COMMIT_DROPPED_CRC = (*_COMMIT_DROPPED, codec.PROPERTY_CRC32)
# THE END LANE: the commit record's properties and the half's properties dict in C (`_native.end_commit_props`,
# `_native.end_props_dict`); each declines (None) to the Python below for what it does not handle.
END_NATIVE = (codec.native if codec.native is not None and hasattr(codec.native, "end_commit_props")
              else None)


@dataclass(frozen=True)
class EndResult:
    """What an END_TRANSACTION did: `outcome` is the transaction's final state (which may be an earlier end's)."""

    code: int
    remark: str | None
    outcome: str | None = None
    changed: bool = False


# The successful results, made once (an EndResult is immutable): what `end` answers per END.
_SUCCESS = {(outcome, changed): EndResult(ResponseCode.SUCCESS, None, outcome, changed)
            for outcome in (COMMIT, ROLLBACK) for changed in (False, True)}


def transaction_id(msg: MessageExt) -> str:
    """The id a transaction is known by: the half message's UNIQ_KEY (what RocketMQ's clients use as the
    transaction id; indexed, and kept by the committed record and by every check-back copy)."""
    return msg.uniq_key or msg.properties.get(PROPERTY_TRANSACTION_ID) or msg.msg_id


def op_properties_string(txid: str) -> str:
    """The op message's properties string: `codec.build_properties_string` of a message with tag `d` and the
    one key `txid` (TAGS, then KEYS when `txid` is not empty), without building it from the message."""
    return f"TAGS\x01{REMOVE_TAG}\x02KEYS\x01{txid}\x02" if txid else f"TAGS\x01{REMOVE_TAG}\x02"


class TransactionalMessageService:
    """Prepares half messages and ends transactions exactly once (see the module docstring)."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.store = broker.store
        self._lock = threading.Lock()
        self._recent: OrderedDict[str, tuple[str, bool]] = OrderedDict()  # id -> (outcome, op written)
        self._boot_offset = self.store.get_max_phy_offset()  # records before it are found through the index

    # -- prepare -----------------------------------------------------------------------------------------
    @staticmethod
    def prepare(msg: Message) -> None:
        """Turn `msg` (properties string set, real topic and queue chosen) into its half message, in place
        (`TransactionalMessageBridge.parseHalfMessageInner`)."""
        props = msg.properties_string or ""
        props = set_property(props, PROPERTY_REAL_TOPIC, msg.topic)
        props = set_property(props, PROPERTY_REAL_QUEUE_ID, str(msg.queue_id))
        msg.properties_string = props
        msg.sys_flag &= ~codec.TRANSACTION_ROLLBACK_TYPE  # resetTransactionValue(sysFlag, TRANSACTION_NOT_TYPE)
        msg.topic = RMQ_SYS_TRANS_HALF_TOPIC
        msg.queue_id = 0

    def ensure_system_topics(self) -> None:
        topics = self.broker.topic_manager
        for topic in (RMQ_SYS_TRANS_HALF_TOPIC, RMQ_SYS_TRANS_OP_HALF_TOPIC):
            topics.ensure(topic, 1, PermName.PERM_READ | PermName.PERM_WRITE)

    # -- end ---------------------------------------------------------------------------------------------
    def half_message(self, commit_log_offset: int, queue_offset: int | None,
                     producer_group: str | None) -> tuple[MessageExt | None, EndResult | None]:
        """The half message at `commit_log_offset`, checked as `EndTransactionProcessor.checkPrepareMessage`
        does; (None, the error to answer) when it is not one of `producer_group`'s half messages."""
        msg = self.store.look_message_by_offset(commit_log_offset) if commit_log_offset >= 0 else None
        if msg is None or msg.topic != RMQ_SYS_TRANS_HALF_TOPIC:
            return None, EndResult(ResponseCode.SYSTEM_ERROR,
                                   f"Find prepared transaction message failed, commitLogOffset {commit_log_offset}")
        if END_NATIVE is not None and msg._properties is None:
            msg._properties = END_NATIVE.end_props_dict(msg.properties_string)  # None: parsed in Python
        group = msg.properties.get(PROPERTY_PRODUCER_GROUP)
        if producer_group is not None and group != producer_group:
            return None, EndResult(ResponseCode.SYSTEM_ERROR,
                                   f"The producer group wrong: the half message belongs to {group!r}, "
                                   f"not {producer_group!r}")
        if queue_offset is not None and msg.queue_offset != queue_offset:
            return None, EndResult(ResponseCode.SYSTEM_ERROR,
                                   f"The transaction state table offset wrong: {queue_offset} is not "
                                   f"{msg.queue_offset}")
        return msg, None

    def end(self, half: MessageExt, commit: bool, wait: bool = True) -> EndResult | None:
        """Commit or roll back the transaction of `half`; idempotent per transaction id. With `wait` False,
        None (nothing done) instead of waiting: for the dispatcher to reach the records written before this
        broker started (the look-up of earlier ends needs them indexed), for the service's lock, or for a
        stream's lock (a stream transaction); the caller then ends it on a thread that may wait."""
        txid = transaction_id(half)
        if wait:
            with self._lock:
                done = self._decide(half, txid, commit)
        else:
            if (half.properties.get(PROPERTY_STREAM_ID)
                    or self.store.reput_message_service.dispatched_offset < self._boot_offset
                    or not self._lock.acquire(blocking=False)):
                return None
            try:
                done = self._decide(half, txid, commit)
            finally:
                self._lock.release()
        if done.__class__ is EndResult:
            return done  # type: ignore[return-value]
        outcome, changed = done  # type: ignore[misc]
        self.broker.stream_versions.release(half, outcome == COMMIT)
        if outcome == DISCARDED:
            return EndResult(ResponseCode.SYSTEM_ERROR,
                             f"transaction {txid} was discarded after too many check-backs", outcome)
        return _SUCCESS[outcome, changed]

    def _decide(self, half: MessageExt, txid: str, commit: bool) -> tuple[str, bool] | EndResult:
        """Under the lock: the transaction's outcome (this end's, or an earlier one's) and whether this end
        decided it, its records written; or the error to answer when the commit could not be written."""
        outcome, op_written = self._outcome(txid, half)
        changed = False
        if outcome is None:
            if commit:
                r = self.store.put_message(self._commit_message(half))
                if not r.is_ok():
                    return EndResult(ResponseCode.SYSTEM_ERROR,
                                     f"commit failed: {r.status.name} {r.reason or ''}".rstrip())
            outcome = COMMIT if commit else ROLLBACK
            self._remember(txid, outcome, False)
            changed = True
        if not op_written:
            self._put_op(half, txid, outcome)
        return outcome, changed

    def known_end(self, txid: str) -> str | None:
        """The outcome of transaction `txid` when this broker remembers its end with the op message written
        (COMMIT: the committed record is in the log too), else None (open, or ended before a restart or long
        ago: only the index knows). A read of the memory without the lock (one dict look-up)."""
        known = self._recent.get(txid)
        return known[0] if known is not None and known[1] else None

    def outcome(self, half: MessageExt) -> str | None:
        """COMMIT, ROLLBACK, DISCARDED, or None while the transaction is open."""
        return self._outcome(transaction_id(half), half)[0]

    def _remember(self, txid: str, outcome: str, op_written: bool) -> None:
        self._recent[txid] = (outcome, op_written)
        self._recent.move_to_end(txid)
        while len(self._recent) > RECENT_ENDS:
            self._recent.popitem(last=False)

    def _outcome(self, txid: str, half: MessageExt) -> tuple[str | None, bool]:
        """(the transaction's outcome or None, whether its op message is written)."""
        known = self._recent.get(txid)
        if known is not None and known[1]:
            return known
        # Everything written before this broker started is in the index once the dispatcher caught up
        # (looked at first: `wait_for` wakes the dispatch thread, which an end on the loop must not do).
        reput = self.store.reput_message_service
        if reput.dispatched_offset < self._boot_offset:
            reput.wait_for(self._boot_offset, 10.0)
        # The index says first, in one walk without reading a record, which of the three searches can find
        # anything at all (the first end of a transaction: none); only those are made.
        real_topic = half.properties.get(PROPERTY_REAL_TOPIC, "")
        may_op, may_commit, may_discard = self.store.index_service.have_candidates(
            [(RMQ_SYS_TRANS_OP_HALF_TOPIC, txid), (real_topic, txid), (RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, txid)])
        op = self._find(RMQ_SYS_TRANS_OP_HALF_TOPIC, txid, lambda m: m.tags == REMOVE_TAG) if may_op else None
        outcome = known[0] if known is not None else None
        if outcome is None:
            if may_commit and self._find(real_topic, txid, lambda m: codec.transaction_value(m.sys_flag)
                                         == codec.TRANSACTION_COMMIT_TYPE) is not None:
                outcome = COMMIT
            elif may_discard and self._find(RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, txid, lambda m: True) is not None:
                outcome = DISCARDED
            elif op is not None:
                outcome = ROLLBACK
        if outcome is not None:
            self._remember(txid, outcome, op is not None)
        return outcome, op is not None

    def _find(self, topic: str, txid: str, accept: object) -> MessageExt | None:
        if not topic:
            return None
        r = self.store.query_message(topic, txid, 32)
        for m in r.messages:
            if m.uniq_key == txid or txid in m.keys_list():
                if accept(m):  # type: ignore[operator]
                    return m
        return None

    def _commit_message(self, half: MessageExt) -> Message:
        """`EndTransactionProcessor.endMessageTransaction`: the real message, a new record. A store that writes
        the `__CRC32#` trailer drops the half's own trailer as it encodes the record; it is dropped here with
        the other properties (the same bytes), so the store's C path takes the record instead of declining
        a properties string that holds a trailer already."""
        props = half.properties_string
        done = (END_NATIVE.end_commit_props(props, half.queue_offset, self.store.config.enabled_append_prop_crc)
                if END_NATIVE is not None else None)
        if done is not None:
            props, real_topic, real_qid = done
        else:
            real_topic = get_property(props, PROPERTY_REAL_TOPIC) or ""
            real_qid = int(get_property(props, PROPERTY_REAL_QUEUE_ID) or 0)
            props = delete_properties(props, _COMMIT_DROPPED_CRC if self.store.config.enabled_append_prop_crc
                                      else _COMMIT_DROPPED)
            props = set_property(props, PROPERTY_TRANSACTION_PREPARED_QUEUE_OFFSET, str(half.queue_offset))
        sys_flag = (half.sys_flag & ~codec.TRANSACTION_ROLLBACK_TYPE) | codec.TRANSACTION_COMMIT_TYPE
        return Message(topic=real_topic, body=bytes(half.body), queue_id=real_qid, flag=half.flag,
                       properties_string=props, sys_flag=sys_flag, born_timestamp=half.born_timestamp,
                       born_host=half.born_host, reconsume_times=half.reconsume_times,
                       prepared_transaction_offset=half.commit_log_offset)

    def _put_op(self, half: MessageExt, txid: str, outcome: str) -> None:
        """The op message (`TransactionalMessageBridge.addRemoveTagInTransactionOp`), keyed by the transaction."""
        op = Message(topic=RMQ_SYS_TRANS_OP_HALF_TOPIC, body=str(half.queue_offset).encode(), tags=REMOVE_TAG,
                     keys=[txid], queue_id=half.queue_id)
        op.properties_string = op_properties_string(txid)
        self._op_written(txid, outcome, self.store.put_message(op))

    def _op_written(self, txid: str, outcome: str, r: PutMessageResult) -> None:
        """After the op message's put: the end remembered with its op message, or a warning (THE END FRAME,
        `_native.end_frame`, calls it for a put that was not OK and remembers an OK one itself)."""
        if r.is_ok():
            self._remember(txid, outcome, True)
        else:
            log.warning("op message for transaction %s not written: %s %s", txid, r.status.name, r.reason or "")

    # -- check-back ----------------------------------------------------------------------------------------
    def put_back(self, half: MessageExt) -> MessageExt | None:
        """Re-put a half message to be checked with TRANSACTION_CHECK_TIMES + 1 (`putBackHalfMsgQueue`); the
        copy as stored (its offsets are what the producer's check answer names), or None."""
        times = int(half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES) or 0)
        props = set_property(half.properties_string, PROPERTY_TRANSACTION_CHECK_TIMES, str(times + 1))
        copy = Message(topic=RMQ_SYS_TRANS_HALF_TOPIC, body=bytes(half.body), queue_id=0, flag=half.flag,
                       properties_string=props, sys_flag=half.sys_flag, born_timestamp=half.born_timestamp,
                       born_host=half.born_host, reconsume_times=half.reconsume_times)
        r = self.store.put_message(copy)
        if not r.is_ok() or r.append_result is None:
            log.warning("could not re-put half message %s for its check: %s", transaction_id(half), r.status.name)
            return None
        return self.store.look_message_by_offset(r.append_result.wrote_offset)

    def discard(self, half: MessageExt) -> None:
        """Past `transaction_check_max`: the half message goes to TRANS_CHECK_MAX_TIME_TOPIC
        (`DefaultTransactionalMessageCheckListener.resolveDiscardMsg`) and is never committed."""
        txid = transaction_id(half)
        with self._lock:
            if self._outcome(txid, half)[0] is not None:
                return
            self.broker.topic_manager.ensure(RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, 1)
            props = half.properties_string
            msg = Message(topic=RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, body=bytes(half.body), queue_id=0,
                          flag=half.flag, properties_string=props, sys_flag=half.sys_flag,
                          born_timestamp=half.born_timestamp, born_host=half.born_host)
            r = self.store.put_message(msg)
            if r.is_ok():
                self._remember(txid, DISCARDED, False)
                self.broker.stream_versions.release(half, False)
                log.warning("transaction %s of producer group %s discarded after %s check-backs (real topic %s)",
                            txid, half.properties.get(PROPERTY_PRODUCER_GROUP),
                            half.properties.get(PROPERTY_TRANSACTION_CHECK_TIMES),
                            half.properties.get(PROPERTY_REAL_TOPIC))
