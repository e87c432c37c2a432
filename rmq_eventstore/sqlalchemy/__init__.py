"""The SQLAlchemy face: events appended in a `Session`'s (or `AsyncSession`'s) transaction, committed or
rolled back with it, on a RocketMQ-compatible store (see ``store`` and ``transactions``)."""

from .marker import EventTransaction, EventTransactionMixin, MarkerBase, marker_table
from .store import (
    AppendError,
    AsyncEventStore,
    BaseEventStore,
    ConcurrencyError,
    Event,
    EventStore,
    NewEvent,
    json_decode,
    json_encode,
)

__all__ = [
    "AppendError", "AsyncEventStore", "BaseEventStore", "ConcurrencyError", "Event", "EventStore", "EventTransaction",
    "EventTransactionMixin", "MarkerBase", "NewEvent", "json_decode", "json_encode", "marker_table",
]
