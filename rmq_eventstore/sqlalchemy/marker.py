"""The marker table: one row per append made inside a database transaction, written in that transaction.

Its presence after the database committed is the proof the broker's check-back asks for: a process of the
producer group answers COMMIT when it finds the row. A check that finds no row inserts one with
``outcome = 'R'`` in its own transaction, so a transaction still open either commits first (the insert then
conflicts: COMMIT) or can never commit its own marker (ROLLBACK). Rows are deleted once resolved.

Three ways to have the table, all with the same columns:

* `EventTransaction`, a typed declarative class on this module's own `MarkerBase` (``MarkerBase.metadata``
  holds only this table: ``MarkerBase.metadata.create_all(engine)``, or add it to Alembic's
  ``target_metadata`` list);
* `EventTransactionMixin` on your own ``DeclarativeBase`` (``class Marker(EventTransactionMixin, Base):
  __tablename__ = "..."``), so your migrations own it like any other model;
* `marker_table(metadata)`: a Core `Table` on a `MetaData` of yours.

`EventStore(marker=...)` takes any of them (the class or the `Table`).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Column, DateTime, Index, MetaData, String, Table
from sqlalchemy.orm import DeclarativeBase, Mapped, declared_attr, mapped_column

TABLE_NAME = "rmq_eventstore_transaction"
COMMIT = "C"
ROLLBACK = "R"


def _now() -> datetime:
    return datetime.now(UTC)


class EventTransactionMixin:
    """The marker's columns, for a mapped class on your own declarative base (set ``__tablename__``)."""

    transaction_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    producer_group: Mapped[str] = mapped_column(String(255), default="")
    topic: Mapped[str] = mapped_column(String(127), default="")
    outcome: Mapped[str] = mapped_column(String(1), default=COMMIT)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=_now)

    @declared_attr.directive
    @classmethod
    def __table_args__(cls) -> tuple[Any, ...]:
        return (Index(f"ix_{cls.__tablename__}_created_at", "created_at"),)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.transaction_id} {self.outcome}>"


class MarkerBase(DeclarativeBase):
    """The declarative base of `EventTransaction` alone (its own ``metadata``)."""


class EventTransaction(EventTransactionMixin, MarkerBase):
    """The default marker table, ``rmq_eventstore_transaction``."""

    __tablename__ = TABLE_NAME


def marker_table(metadata: MetaData, name: str = TABLE_NAME) -> Table:
    """The marker table as a Core `Table` on `metadata` (the one already there if `name` is defined)."""
    if name in metadata.tables:
        return metadata.tables[name]
    return Table(
        name, metadata,
        Column("transaction_id", String(64), primary_key=True),
        Column("producer_group", String(255), nullable=False, default=""),
        Column("topic", String(127), nullable=False, default=""),
        Column("outcome", String(1), nullable=False, default=COMMIT),
        Column("created_at", DateTime(timezone=True), nullable=False, default=_now),
        Index(f"ix_{name}_created_at", "created_at"),
    )


def as_table(marker: Any) -> Table:
    """The `Table` of a marker given as a mapped class or a `Table` (None: `EventTransaction`'s)."""
    if marker is None:
        return EventTransaction.__table__  # type: ignore[return-value]
    if isinstance(marker, Table):
        table = marker
    else:
        table = getattr(marker, "__table__", None)
        if not isinstance(table, Table):
            raise TypeError(f"marker must be a Table or a mapped class with a __table__, not {marker!r}")
    missing = {"transaction_id", "producer_group", "topic", "outcome", "created_at"} - set(table.c.keys())
    if missing:
        raise ValueError(f"marker table {table.name} lacks the columns {sorted(missing)}")
    return table
