"""Transactional (half) messages as RocketMQ 5 does them: `service` prepares half messages and ends
transactions (exactly once per transaction), `check_service` asks producers about the ones nobody ended."""

from .check_service import TransactionalMessageCheckService
from .service import CHECK_GROUP, COMMIT, DISCARDED, ROLLBACK, EndResult, TransactionalMessageService

__all__ = ["CHECK_GROUP", "COMMIT", "DISCARDED", "ROLLBACK", "EndResult", "TransactionalMessageCheckService",
           "TransactionalMessageService"]
