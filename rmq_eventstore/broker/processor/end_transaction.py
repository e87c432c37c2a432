"""Ends of transactions (`EndTransactionProcessor`): END_TRANSACTION commits or rolls back a half message.

`commitOrRollback` carries the sysFlag value: TRANSACTION_COMMIT_TYPE (8) commits, TRANSACTION_ROLLBACK_TYPE
(12) rolls back, TRANSACTION_NOT_TYPE (0, the producer does not know yet) changes nothing and leaves the
transaction to the check-back. Producers send it one-way; an answer goes back only to a two-way request.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ...common import codec
from ...remoting import RemotingCommand, RequestCode, ResponseCode

if TYPE_CHECKING:
    from ..broker import Broker

log = logging.getLogger(__name__)


class EndTransactionProcessor:
    """END_TRANSACTION."""

    CODES = (RequestCode.END_TRANSACTION,)

    def __init__(self, broker: Broker) -> None:
        self.broker = broker

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
