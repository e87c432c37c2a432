"""`EventTransaction`: the app's one table, the marker rows of appends made inside database transactions
(see ``transactions``). Its own module so that the append path can use it without importing the event
models."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db import connections, models
from django.utils import timezone

try:  # psycopg 3: the marker insert's short path on PostgreSQL (`_insert_on_pgconn`)
    from psycopg import pq as _pq
    from psycopg.errors import error_from_result as _error_from_result

    _INTRANS, _COMMAND_OK = _pq.TransactionStatus.INTRANS, _pq.ExecStatus.COMMAND_OK
except ImportError:  # SQLite only, or psycopg2: every insert goes through the cursor
    _INTRANS = _COMMAND_OK = _error_from_result = None

_INSERT_SQL: dict[str, str] = {}  # the marker insert per database vendor (quoting differs)
_PG_SQL: dict[str, bytes] = {}  # the PostgreSQL insert with $n parameters, for libpq's exec_params


def _insert_on_pgconn(conn: Any, sql: str, values: tuple) -> bool:
    """The marker insert on PostgreSQL with psycopg 3, sent through the session's libpq connection
    (`pgconn.exec_params`: one statement, text parameters, no server-side state) instead of Django's cursor
    and psycopg's: the same statement, row and errors (raised as Django raises a cursor's, IntegrityError
    for a marker that is there) at a fifth of the CPU. Only inside a transaction block the server has open
    (a first statement of a transaction goes through the cursor, which sends the BEGIN) and only when
    nothing watches the connection's queries (DEBUG's query log, `execute_wrapper`s). False: not taken, run
    it through the cursor."""
    raw = conn.connection
    pgconn = getattr(raw, "pgconn", None)
    if (pgconn is None or conn.vendor != "postgresql" or conn.queries_logged or conn.execute_wrappers
            or pgconn.transaction_status != _INTRANS):
        return False
    text = _PG_SQL.get(sql)
    if text is None:
        parts = sql.split("%s")
        text = _PG_SQL[sql] = "".join(p + (f"${i + 1}" if i < len(parts) - 1 else "")
                                      for i, p in enumerate(parts)).encode()
    a, b, c, d, when = values if len(values) == 5 else (None,) * 5  # the marker's row (`EventTransaction.insert`)
    if (when.__class__ is datetime and a.__class__ is str and b.__class__ is str and c.__class__ is str
            and d.__class__ is str):  # the usual row: the same texts, written out
        params = [a.encode(), b.encode(), c.encode(), d.encode(), when.isoformat().encode()]
    else:
        params = [None if v is None else (v.isoformat() if v.__class__ is datetime else str(v)).encode()
                  for v in values]
    with raw.lock:
        result = pgconn.exec_params(text, params)
    if result.status != _COMMAND_OK:
        with conn.wrap_database_errors:
            raise _error_from_result(result, encoding=raw.info.encoding)
    return True


class EventTransaction(models.Model):
    """The marker of an append made inside a database transaction, written in that transaction.

    Its presence after the database committed is the proof the broker's check-back asks for: a process of
    the producer group answers COMMIT when it finds the row. A check that finds no row inserts one with
    ``outcome = ROLLBACK`` in its own transaction, so a transaction still open either commits first (the
    insert then conflicts and the answer is COMMIT) or can never commit its marker. Rows are deleted once
    the broker confirmed the end."""

    COMMIT = "C"
    ROLLBACK = "R"

    transaction_id = models.CharField(max_length=64, primary_key=True)
    store_alias = models.CharField(max_length=64, default="default")
    topic = models.CharField(max_length=127)
    outcome = models.CharField(max_length=1, choices=[(COMMIT, "commit"), (ROLLBACK, "rollback")], default=COMMIT)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        verbose_name = "event transaction marker"
        db_table = "rmq_eventstore_transaction"

    def __str__(self) -> str:
        return f"{self.transaction_id} ({self.get_outcome_display()})"

    @classmethod
    def insert(cls, using: str, transaction_id: str, store_alias: str, topic: str, outcome: str,
               conn: Any = None) -> None:
        """Insert a marker row with one statement through the connection's cursor: the row
        `objects.using(using).create(...)` writes (created_at = now, adapted as the field would), at a third
        of its CPU (no model instance, no SQL compiler, no save signals: nobody listens on this table). It
        runs on every transactional append, inside the caller's transaction. Raises the database's errors
        as the ORM does (`IntegrityError` for a marker that is there). `conn`: ``connections[using]``, when
        the caller has it."""
        if conn is None:
            conn = connections[using]
        sql = _INSERT_SQL.get(conn.vendor)
        if sql is None:
            qn = conn.ops.quote_name
            meta = cls._meta
            names = ("transaction_id", "store_alias", "topic", "outcome", "created_at")
            columns = ", ".join(qn(meta.get_field(n).column) for n in names)
            sql = _INSERT_SQL[conn.vendor] = f"INSERT INTO {qn(meta.db_table)} ({columns}) VALUES (%s, %s, %s, %s, %s)"
        created_at = conn.ops.adapt_datetimefield_value(timezone.now())
        if _insert_on_pgconn(conn, sql, (transaction_id, store_alias, topic, outcome, created_at)):
            return
        with conn.cursor() as cursor:
            cursor.execute(sql, [transaction_id, store_alias, topic, outcome, created_at])


class Dashboard(models.Model):
    """No table and no permissions: the staff dashboard's entry in the admin (``dashboard.admin``). Registering
    it gives the admin index its "Dashboard" link and the dashboard its URLs under the admin site."""

    class Meta:
        managed = False
        default_permissions = ()
        verbose_name = "dashboard"
        verbose_name_plural = "dashboard"


class HandledEvent(models.Model):
    """An event a consumer group has handled, written in the same database transaction as the handler's own
    writes (`rmq_eventstore.django.handlers.once`): a redelivered event finds its row and is skipped, so
    at-least-once delivery gives exactly-once effects on the database."""

    group = models.CharField(max_length=255)
    msg_id = models.CharField(max_length=64)
    handled_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        db_table = "rmq_eventstore_handled_event"
        constraints = [models.UniqueConstraint(fields=["group", "msg_id"], name="rmq_eventstore_handled_once")]

    def __str__(self) -> str:
        return f"{self.group}: {self.msg_id}"
