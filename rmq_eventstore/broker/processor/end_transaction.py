"""Ends of transactions (`EndTransactionProcessor`): END_TRANSACTION commits or rolls back a half message.

`commitOrRollback` carries the sysFlag value: TRANSACTION_COMMIT_TYPE (8) commits, TRANSACTION_ROLLBACK_TYPE
(12) rolls back, TRANSACTION_NOT_TYPE (0, the producer does not know yet) changes nothing and leaves the
transaction to the check-back. Producers send it one-way; an answer goes back only to a two-way request.

The usual one-way END is served before it is decoded, from the bytes read, by `_native.end_frame` (THE END FRAME,
called by the server's `Connection.data_received` with `frame_context()`); `process` is its reference and serves
everything it declines.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from ...common import codec
from ...common.topic import (
    RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
    RMQ_SYS_TRANS_HALF_TOPIC,
    RMQ_SYS_TRANS_OP_HALF_TOPIC,
)
from ...remoting import RemotingCommand, RequestCode, ResponseCode
from ..transaction import service as _service

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger(__name__)

# THE END FRAME (branch end-lane2): a one-way END_TRANSACTION read and served from the bytes read, in one C call
# (`_native.end_frame`, called by the server's `Connection.data_received`); None without the native core
END_FRAME = codec.native.end_frame if codec.native is not None and hasattr(codec.native, "end_frame") else None


class EndTransactionProcessor:
    """END_TRANSACTION."""

    CODES = (RequestCode.END_TRANSACTION,)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

    def frame_context(self) -> tuple[Any, ...]:
        """What `_native.end_frame` reads besides the frame: this broker (its transaction service, looked up at
        each END), the service's class (another class is left to `process`), the system topics, the outcomes,
        the op message's tag, the service module's globals (RECENT_ENDS, read at each end) and OrderedDict
        (the type `_recent` must have)."""
        return (self.broker, _service.TransactionalMessageService, RMQ_SYS_TRANS_HALF_TOPIC,
                RMQ_SYS_TRANS_OP_HALF_TOPIC, RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC, _service.COMMIT, _service.ROLLBACK,
                _service.REMOVE_TAG, vars(_service), OrderedDict)

    def process(self, req: RemotingCommand, channel: Any, wait: bool = True) -> RemotingCommand | None:
        """The answer (written back only to a two-way request); with `wait` False, None instead of waiting
        (see `TransactionalMessageService.end`): the server then ends the transaction on a worker thread."""
        kind = req.get_int("commitOrRollback")
        from_check = req.get_bool("fromTransactionCheck", False)
        group = req.get_str("producerGroup")
        if kind == codec.TRANSACTION_NOT_TYPE:
            log.debug("transaction %s of %s: state unknown (from check: %s)", req.get_str("transactionId", ""),
                      group, from_check)
            return req.response()
        if kind not in (codec.TRANSACTION_COMMIT_TYPE, codec.TRANSACTION_ROLLBACK_TYPE):
            return req.response(ResponseCode.SYSTEM_ERROR, f"commitOrRollback {kind} is not 0, 8 or 12")
        service = self.broker.transaction_service
        half, error = service.half_message(req.get_int("commitLogOffset"), req.get_int("tranStateTableOffset", None),
                                           group)
        if half is None:
            assert error is not None
            log.warning("END_TRANSACTION from %s refused: %s", getattr(channel, "remote_address", "in-process"),
                        error.remark)
            return req.response(error.code, error.remark)
        result = service.end(half, kind == codec.TRANSACTION_COMMIT_TYPE, wait)
        if result is None:
            return None
        return req.response(result.code, result.remark)
