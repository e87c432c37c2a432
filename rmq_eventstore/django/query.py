"""`EventQuerySet`: Django's `QuerySet` over a topic of the store.

Django's own `sql.Query` still parses and validates ``filter()``/``exclude()``/``Q``/``order_by()`` and
slicing; only execution is ours. The where tree is planned onto what the store can answer:

* the index: ``msg_id``, ``keys`` and ``stream`` (exact / in), and ``commit_log_offset`` (exact / in, a
  direct read);
* the consume queues: ``queue_id``, ``queue_offset`` and ``stored_at`` ranges (a time is turned into a queue
  offset, as RocketMQ's ``searchOffset``), and ``tags`` (exact / in, the consume queue's tag codes);

then the whole where tree is evaluated in Python on the candidates, so results have Django's semantics
exactly (``exclude``, ``Q`` with OR and negation, NULLs). A lookup the store cannot narrow (``data__...``,
``born_at``, ``body``, ``keys__icontains``, ...) is accepted beside an index lookup that bounds the
candidates, and otherwise raises `NotSupportedError` naming what is supported: reading a whole topic to
evaluate it is never silent, it is ``.scan()``.

Ordering by ``commit_log_offset`` or ``stored_at`` (RocketMQ stores in commitlog order, so store times rise
with the offset) streams a merge of the queues and stops at the slice's end; any other ordering sorts the
candidates in memory.
"""

from __future__ import annotations

import datetime
import heapq
import itertools
import operator
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from django.db import NotSupportedError
from django.db.models import Count, Max, Min, QuerySet, Sum
from django.db.models.expressions import Col
from django.db.models.fields.json import KeyTransform
from django.db.models.lookups import Lookup, Transform
from django.db.models.query import BaseIterable, ModelIterable
from django.db.models.sql.where import AND, OR, XOR, NothingNode, WhereNode
from django.utils import timezone

if TYPE_CHECKING:
    from .connection import EventStore
    from .models import EventModel

PULL_BATCH = 256
INDEX_FIELDS = {"msg_id", "keys", "stream", "commit_log_offset"}
QUEUE_FIELDS = {"queue_id", "queue_offset", "stored_at", "tags", "commit_log_offset"}
RANGE_LOOKUPS = {"exact", "in", "gt", "gte", "lt", "lte", "range"}
SUPPORTED_HELP = ("msg_id / keys / stream (exact, in), commit_log_offset (exact, in, ranges), tags (exact, in), "
                  "queue_id / queue_offset / stored_at (exact, in, gt, gte, lt, lte, range); anything else only "
                  "beside an index lookup (msg_id, keys, stream, commit_log_offset) or after .scan()")
STREAM_ORDER_FIELDS = {"commit_log_offset", "stored_at"}
RECORD_FIELDS = INDEX_FIELDS | QUEUE_FIELDS | {"version"}
MAX_TIME = 2**62


def _ms(value: datetime.datetime) -> int:
    if timezone.is_naive(value):
        value = timezone.make_aware(value, datetime.UTC)
    return int(value.timestamp() * 1000)


# -- evaluation of Django lookups in Python ---------------------------------------------------------------

def _ci(v: Any) -> Any:
    return v.casefold() if isinstance(v, str) else v


def _cmp(op: Callable[[Any, Any], bool]) -> Callable[[Any, Any], bool]:
    def f(value: Any, rhs: Any) -> bool:
        try:
            return bool(op(value, rhs))
        except TypeError:
            return False
    return f


def _str_op(op: Callable[[Any, Any], bool], fold: bool) -> Callable[[Any, Any], bool]:
    def f(value: Any, rhs: Any) -> bool:
        if value is None or rhs is None:
            return False
        if isinstance(value, (bytes, bytearray, memoryview)):  # a BinaryField: compare bytes
            a, b = bytes(value), rhs if isinstance(rhs, bytes) else str(rhs).encode()
            return op(a.lower(), b.lower()) if fold else op(a, b)
        a, b = str(value), str(rhs)
        if fold:
            a, b = a.casefold(), b.casefold()
        return op(a, b)
    return f


def _regex(flags: int) -> Callable[[Any, Any], bool]:
    def f(value: Any, rhs: Any) -> bool:
        return value is not None and re.search(str(rhs), str(value), flags) is not None
    return f


LOOKUPS: dict[str, Callable[[Any, Any], bool]] = {
    "exact": lambda v, r: v is not None and v == r,
    "iexact": lambda v, r: v is not None and _ci(v) == _ci(r),
    "gt": _cmp(operator.gt), "gte": _cmp(operator.ge), "lt": _cmp(operator.lt), "lte": _cmp(operator.le),
    "in": lambda v, r: v is not None and v in r,
    "range": lambda v, r: v is not None and _cmp(lambda a, b: b[0] <= a <= b[1])(v, r),
    "isnull": lambda v, r: (v is None) == bool(r),
    "contains": _str_op(lambda a, b: b in a, False), "icontains": _str_op(lambda a, b: b in a, True),
    "startswith": _str_op(str.startswith, False), "istartswith": _str_op(str.startswith, True),
    "endswith": _str_op(str.endswith, False), "iendswith": _str_op(str.endswith, True),
    "regex": _regex(0), "iregex": _regex(re.IGNORECASE),
}

_DATE_PARTS: dict[str, Callable[[Any], Any]] = {
    "date": lambda d: timezone.localtime(d).date(), "year": lambda d: timezone.localtime(d).year,
    "month": lambda d: timezone.localtime(d).month, "day": lambda d: timezone.localtime(d).day,
    "hour": lambda d: timezone.localtime(d).hour, "minute": lambda d: timezone.localtime(d).minute,
    "week_day": lambda d: timezone.localtime(d).isoweekday() % 7 + 1,
}


def _unsupported(what: str) -> NotSupportedError:
    return NotSupportedError(f"the event store cannot answer {what}; supported: {SUPPORTED_HELP}")


def _value_getter(lhs: Any) -> tuple[str, Callable[[dict[str, Any]], Any]]:
    """(the field's attname, row → the value the lookup compares) for a lookup's left-hand side."""
    if isinstance(lhs, Col):
        name = lhs.target.attname
        return name, operator.itemgetter(name)
    if isinstance(lhs, KeyTransform):
        base_name, base = _value_getter(lhs.lhs)
        key = lhs.key_name

        def get_key(row: dict[str, Any]) -> Any:
            v = base(row)
            if isinstance(v, dict):
                return v.get(key)
            if isinstance(v, list) and str(key).lstrip("-").isdigit():
                i = int(key)
                return v[i] if -len(v) <= i < len(v) else None
            return None
        return base_name, get_key
    if isinstance(lhs, Transform) and lhs.lookup_name in _DATE_PARTS:
        base_name, base = _value_getter(lhs.lhs)
        part = _DATE_PARTS[lhs.lookup_name]

        def get_part(row: dict[str, Any]) -> Any:
            v = base(row)
            return None if v is None else part(v)
        return base_name, get_part
    raise _unsupported(f"the expression {lhs!r}")


def compile_where(node: Any) -> Callable[[dict[str, Any]], bool]:
    """A Python predicate over rows with the semantics of Django's where tree."""
    if isinstance(node, NothingNode):
        return lambda row: False
    if isinstance(node, Lookup):
        if node.lookup_name not in LOOKUPS:
            raise _unsupported(f"the lookup __{node.lookup_name}")
        if hasattr(node.rhs, "resolve_expression"):
            raise _unsupported(f"an expression on the right of __{node.lookup_name} ({node.rhs!r})")
        _, get = _value_getter(node.lhs)
        test = LOOKUPS[node.lookup_name]
        rhs = node.rhs
        if node.lookup_name == "in":
            rhs = set(rhs) if all(isinstance(x, (str, int)) for x in rhs) else list(rhs)
        elif node.lookup_name == "range":
            rhs = tuple(rhs)
        name, _ = _value_getter(node.lhs)
        if name == "keys" and node.lookup_name in ("exact", "in"):  # one of the message's keys
            wanted = rhs if node.lookup_name == "in" else {rhs}
            return lambda row: any(k in wanted for k in (row["keys"] or "").split())
        return lambda row: test(get(row), rhs)
    if isinstance(node, WhereNode):
        parts = [compile_where(c) for c in node.children]
        if node.connector == AND:
            def f(row: dict[str, Any]) -> bool:
                return all(p(row) for p in parts)
        elif node.connector == OR:
            def f(row: dict[str, Any]) -> bool:
                return any(p(row) for p in parts)
        elif node.connector == XOR:
            def f(row: dict[str, Any]) -> bool:
                return sum(1 for p in parts if p(row)) % 2 == 1
        else:  # pragma: no cover
            raise _unsupported(f"the connector {node.connector}")
        if node.negated:
            return lambda row: not f(row)
        return f
    raise _unsupported(f"the condition {node!r}")


# -- planning ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Empty:
    """Nothing can match."""


@dataclass(frozen=True)
class IndexPlan:
    """Candidates from the index (or a direct read by commitlog offset): `field` is one of INDEX_FIELDS."""

    field: str
    values: frozenset

    def __len__(self) -> int:
        return len(self.values)


@dataclass(frozen=True)
class QueuePlan:
    """Candidates from consume-queue ranges: queue ids, [lo, hi) queue offsets, [lo, hi) store times (ms),
    tags. Every bound is optional; an exact plan's constraints are the whole where tree (count without
    reading)."""

    queues: frozenset | None = None
    qo_lo: int = 0
    qo_hi: int | None = None
    ts_lo: int = 0
    ts_hi: int | None = None
    tags: frozenset | None = None
    exact: bool = True

    def intersect(self, o: QueuePlan) -> QueuePlan:
        return QueuePlan(
            self.queues if o.queues is None else o.queues if self.queues is None else self.queues & o.queues,
            max(self.qo_lo, o.qo_lo), _min_opt(self.qo_hi, o.qo_hi), max(self.ts_lo, o.ts_lo),
            _min_opt(self.ts_hi, o.ts_hi),
            self.tags if o.tags is None else o.tags if self.tags is None else self.tags & o.tags,
            self.exact and o.exact)

    def hull(self, o: QueuePlan) -> QueuePlan:
        return QueuePlan(None if self.queues is None or o.queues is None else self.queues | o.queues,
                         min(self.qo_lo, o.qo_lo), _max_opt(self.qo_hi, o.qo_hi), min(self.ts_lo, o.ts_lo),
                         _max_opt(self.ts_hi, o.ts_hi),
                         None if self.tags is None or o.tags is None else self.tags | o.tags, False)


@dataclass(frozen=True)
class UnionPlan:
    plans: tuple


@dataclass(frozen=True)
class Residual:
    """A condition only Python can evaluate: fine beside an index plan, unanswerable alone."""

    what: str
    field: str = ""
    lookup: str = ""

    @property
    def null_test(self) -> bool:
        """`field__isnull` on a record field, which `exclude()` adds for nullable fields: evaluable on any
        message a negated lookup reads."""
        return self.lookup == "isnull" and self.field in RECORD_FIELDS


FULL = QueuePlan(exact=True)


def _min_opt(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _max_opt(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else max(a, b)


def _leaf_plan(node: Lookup) -> Any:
    name, _ = _value_getter(node.lhs)
    lookup = node.lookup_name
    rhs = node.rhs
    if not isinstance(node.lhs, Col) or hasattr(rhs, "resolve_expression"):
        return Residual(f"{name}__…__{lookup}")
    if lookup in ("exact", "in") and name in INDEX_FIELDS:
        values = frozenset(rhs) if lookup == "in" else frozenset([rhs])
        if not values:
            return Empty()
        return IndexPlan(name, values)
    if name == "tags" and lookup in ("exact", "in"):
        values = frozenset(rhs) if lookup == "in" else frozenset([rhs])
        return QueuePlan(tags=values) if values else Empty()
    if name in ("queue_id", "queue_offset", "stored_at", "commit_log_offset") and lookup in RANGE_LOOKUPS:
        if name == "commit_log_offset":  # a range of the commitlog: read the queues, filter in Python
            return QueuePlan(exact=False)
        conv: Callable[[Any], int] = _ms if name == "stored_at" else int
        if lookup == "in":
            if name == "queue_id":
                return QueuePlan(queues=frozenset(int(v) for v in rhs)) if rhs else Empty()
            vals = [conv(v) for v in rhs]
            if not vals:
                return Empty()
            lo, hi = min(vals), max(vals) + 1
            return _range_plan(name, lo, hi, exact=False)
        if lookup == "exact":
            v = conv(rhs)
            if name == "queue_id":
                return QueuePlan(queues=frozenset([v]))
            return _range_plan(name, v, v + 1)
        lo, hi = 0, None
        if lookup == "gt":
            lo = conv(rhs) + 1
        elif lookup == "gte":
            lo = conv(rhs)
        elif lookup == "lt":
            hi = conv(rhs)
        elif lookup == "lte":
            hi = conv(rhs) + 1
        else:  # range (inclusive)
            lo, hi = conv(rhs[0]), conv(rhs[1]) + 1
        if name == "queue_id":
            return QueuePlan(exact=False) if hi is None else QueuePlan(queues=frozenset(range(max(lo, 0), hi)))
        return _range_plan(name, lo, hi)
    return Residual(f"{name}__{lookup}", name, lookup)


def _range_plan(name: str, lo: int, hi: int | None, exact: bool = True) -> QueuePlan | Empty:
    if hi is not None and hi <= lo:
        return Empty()
    if name == "queue_offset":
        return QueuePlan(qo_lo=max(lo, 0), qo_hi=hi, exact=exact)
    return QueuePlan(ts_lo=max(lo, 0), ts_hi=hi, exact=exact)


def _inexact(p: Any) -> Any:
    return replace(p, exact=False) if isinstance(p, QueuePlan) else p


def plan_where(node: Any) -> Any:
    """A plan for Django's where tree (see the module docstring)."""
    if isinstance(node, NothingNode):
        return Empty()
    if isinstance(node, Lookup):
        return _leaf_plan(node)
    if not isinstance(node, WhereNode):
        return Residual(repr(node))
    if not node.children:
        return FULL
    children = [plan_where(c) for c in node.children]
    if node.negated:  # NOT narrows nothing; it is evaluable when what it negates is
        bad = [c for c in children if isinstance(c, Residual) and not c.null_test]
        return bad[0] if bad else QueuePlan(exact=False)
    if node.connector == AND:
        if any(isinstance(c, Empty) for c in children):
            return Empty()
        index = [c for c in children if isinstance(c, IndexPlan)]
        if index:
            return min(index, key=len)
        unions = [c for c in children if isinstance(c, UnionPlan)]
        queue = [c for c in children if isinstance(c, QueuePlan)]
        residual = [c for c in children if isinstance(c, Residual)]
        if unions and not queue and not residual:
            return unions[0] if len(children) == 1 else UnionPlan(tuple(_inexact(p) for p in unions[0].plans))
        if residual:
            return residual[0]
        plan = FULL
        for q in queue:
            plan = plan.intersect(q)
        if unions:
            plan = replace(plan, exact=False)
        return plan
    # OR / XOR: a union of what each side needs
    children = [c for c in children if not isinstance(c, Empty)]
    if not children:
        return Empty()
    residual = [c for c in children if isinstance(c, Residual)]
    if residual:
        return residual[0]
    if node.connector == XOR:
        return QueuePlan(exact=False)
    if all(isinstance(c, IndexPlan) for c in children) and len({c.field for c in children}) == 1:
        return IndexPlan(children[0].field, frozenset().union(*(c.values for c in children)))
    flat: list[Any] = []
    for c in children:
        flat.extend(c.plans if isinstance(c, UnionPlan) else [c])
    if all(isinstance(c, QueuePlan) for c in flat):
        hull = flat[0]
        for q in flat[1:]:
            hull = hull.hull(q)
        return replace(hull, exact=len(flat) == 1 and flat[0].exact)
    return UnionPlan(tuple(_inexact(p) for p in flat))


# -- execution --------------------------------------------------------------------------------------------

@dataclass
class Ordering:
    keys: list[tuple[str, bool]] = field(default_factory=list)  # (attname, descending)

    @property
    def streamable(self) -> bool:
        return bool(self.keys) and self.keys[0][0] in STREAM_ORDER_FIELDS

    @property
    def descending(self) -> bool:
        return bool(self.keys) and self.keys[0][1]


def _sort_rows(rows: list[dict[str, Any]], keys: list[tuple[str, bool]]) -> list[dict[str, Any]]:
    """Stable multi-key sort; NULLs first ascending, last descending (as SQLite and Django's Python sort)."""
    for name, desc in reversed(keys):
        rows.sort(key=lambda r, n=name: (r[n] is not None, r[n] if r[n] is not None else 0), reverse=desc)
    return rows


class QueryRunner:
    """Runs one `EventQuerySet`'s plan against the store and yields rows (dicts of attname → value)."""

    def __init__(self, qs: EventQuerySet) -> None:
        self.qs = qs
        self.model: type[EventModel] = qs.model
        self.store: EventStore = qs.event_store
        self.topic: str = qs.model.topic
        query = qs.query
        self.where = compile_where(query.where)
        model_tags = getattr(self.model, "tag_set", None)
        plan = plan_where(query.where)
        if model_tags:
            plan = self._and_tags(plan, frozenset(model_tags))
        if isinstance(plan, Residual):
            if not qs._scan:
                raise _unsupported(f"{plan.what} without an index lookup")
            plan = QueuePlan(tags=frozenset(model_tags) if model_tags else None, exact=False)
        self.plan = plan
        self.ordering = self._ordering()
        self.low = query.low_mark
        self.high = query.high_mark

    @staticmethod
    def _and_tags(plan: Any, tags: frozenset) -> Any:
        if isinstance(plan, QueuePlan):
            return plan.intersect(QueuePlan(tags=tags))
        if isinstance(plan, UnionPlan):
            return UnionPlan(tuple(QueryRunner._and_tags(p, tags) for p in plan.plans))
        return plan

    def _ordering(self) -> Ordering:
        query = self.qs.query
        names: Iterable[Any] = query.order_by or (self.model._meta.ordering if query.default_ordering else ())
        keys: list[tuple[str, bool]] = []
        for n in names:
            if not isinstance(n, str):
                raise _unsupported(f"ordering by the expression {n!r}")
            desc = n.startswith("-")
            n = n.lstrip("-+")
            if n == "?":
                raise _unsupported("random ordering")
            if n == "pk":
                n = self.model._meta.pk.attname
            try:
                f = self.model._meta.get_field(n)
            except Exception:
                raise _unsupported(f"ordering by {n!r}") from None
            keys.append((f.attname, desc))
        if not query.standard_ordering:
            keys = [(n, not d) for n, d in keys]
        return Ordering(keys)

    # rows
    def row(self, m: Any) -> dict[str, Any]:
        return self.model.row_from_message(m)

    def _by_index(self, plan: IndexPlan) -> list[Any]:
        msgs: dict[int, Any] = {}
        admin = self.store.admin
        for value in plan.values:
            if plan.field == "stream":
                found = admin.read_stream(self.topic, str(value))
            elif plan.field == "commit_log_offset":
                m = admin.view_message_at(self.topic, int(value)) if int(value) >= 0 else None
                found = [m] if m is not None and m.topic == self.topic else []
            else:
                found = admin.query_key_all(self.topic, str(value))
                if plan.field == "msg_id" and not found:
                    found = self._by_offset_msg_id(str(value))
            for m in found:
                msgs[m.commit_log_offset] = m
        return [msgs[k] for k in sorted(msgs)]

    def _by_offset_msg_id(self, value: str) -> list[Any]:
        """A message without UNIQ_KEY is known by its offsetMsgId (store host + commitlog offset)."""
        if not re.fullmatch(r"[0-9A-Fa-f]{32}|[0-9A-Fa-f]{56}", value):
            return []
        offset = int(value[-16:], 16)
        m = self.store.admin.view_message_at(self.topic, offset)
        return [m] if m is not None and m.topic == self.topic and m.uniq_key is None and m.msg_id == value.upper() \
            else []

    def _queue_ranges(self, plan: QueuePlan) -> list[tuple[int, int, int]]:
        """(queue id, lo, hi) for each queue the plan reads."""
        out = []
        admin = self.store.admin
        for q in self.store.queue_ids(self.topic):
            if plan.queues is not None and q not in plan.queues:
                continue
            lo = max(admin.min_offset(self.topic, q), plan.qo_lo)
            hi = admin.max_offset(self.topic, q)
            if plan.qo_hi is not None:
                hi = min(hi, plan.qo_hi)
            if lo < hi and plan.ts_lo > 0:
                lo = max(lo, admin.search_offset(self.topic, q, plan.ts_lo))
            if lo < hi and plan.ts_hi is not None:
                hi = min(hi, admin.search_offset(self.topic, q, plan.ts_hi))
            if lo < hi:
                out.append((q, lo, hi))
        return out

    def _expression(self, plan: QueuePlan) -> str:
        return "*" if plan.tags is None else " || ".join(sorted(str(t) for t in plan.tags)) or "*"

    def _read_queue(self, q: int, lo: int, hi: int, expr: str, desc: bool) -> Iterator[Any]:
        reader = self.store.reader
        if not desc:
            offset = lo
            while offset < hi:
                r = reader.pull(self.topic, q, offset, min(PULL_BATCH, hi - offset), 0, expr)
                for m in r.messages:
                    if m.queue_offset >= hi:
                        return
                    yield m
                if r.next_begin_offset <= offset:
                    return
                offset = r.next_begin_offset
            return
        end = hi
        while end > lo:
            start = max(lo, end - PULL_BATCH)
            chunk: list[Any] = []
            offset = start
            while offset < end:
                r = reader.pull(self.topic, q, offset, end - offset, 0, expr)
                chunk += [m for m in r.messages if m.queue_offset < end]
                if r.next_begin_offset <= offset:
                    break
                offset = r.next_begin_offset
            yield from reversed(chunk)
            end = start

    def _queue_messages(self, plan: QueuePlan, desc: bool) -> Iterator[Any]:
        """The plan's messages merged across queues in commitlog order (ascending or descending)."""
        expr = self._expression(plan)
        iters = [self._read_queue(q, lo, hi, expr, desc) for q, lo, hi in self._queue_ranges(plan)]
        sign = -1 if desc else 1
        keyed = [((sign * m.commit_log_offset, m) for m in it) for it in iters]
        for _, m in heapq.merge(*keyed, key=operator.itemgetter(0)):
            if plan.ts_hi is not None and m.store_timestamp >= plan.ts_hi:
                continue
            if m.store_timestamp < plan.ts_lo:
                continue
            yield m

    def _messages(self, plan: Any, desc: bool) -> Iterator[Any]:
        if isinstance(plan, Empty):
            return iter(())
        if isinstance(plan, IndexPlan):
            msgs = self._by_index(plan)
            return iter(reversed(msgs) if desc else msgs)
        if isinstance(plan, QueuePlan):
            return self._queue_messages(plan, desc)
        if isinstance(plan, UnionPlan):
            seen: set[int] = set()
            everything: list[Any] = []
            for p in plan.plans:
                for m in self._messages(p, False):
                    if m.commit_log_offset not in seen:
                        seen.add(m.commit_log_offset)
                        everything.append(m)
            everything.sort(key=lambda m: m.commit_log_offset, reverse=desc)
            return iter(everything)
        raise AssertionError(plan)  # pragma: no cover

    def rows(self) -> Iterator[dict[str, Any]]:
        """Matching rows in the query's order, sliced."""
        keys = self.ordering.keys
        desc = self.ordering.descending
        matching = (r for r in (self.row(m) for m in self._messages(self.plan, desc)) if self.where(r))
        if not keys:
            ordered: Iterable[dict[str, Any]] = matching
        elif self.ordering.streamable:
            ordered = self._grouped(matching, keys)
        else:
            ordered = _sort_rows(list(matching), keys)
        return itertools.islice(ordered, self.low, self.high)

    @staticmethod
    def _grouped(rows: Iterable[dict[str, Any]], keys: list[tuple[str, bool]]) -> Iterator[dict[str, Any]]:
        """Rows arriving in commitlog order, re-sorted only within runs of an equal first key."""
        first = keys[0][0]
        if first == "commit_log_offset" or len(keys) == 1:
            yield from rows
            return
        for _, group in itertools.groupby(rows, key=operator.itemgetter(first)):
            yield from _sort_rows(list(group), keys)

    def count(self) -> int:
        plan = self.plan
        if isinstance(plan, QueuePlan) and plan.exact and plan.tags is None and not getattr(self.model, "tag_set", None):
            total = sum(hi - lo for _, lo, hi in self._queue_ranges(plan))
        else:
            total = sum(1 for m in self._messages(plan, False) if self.where(self.row(m)))
        total = max(total - self.low, 0)
        return total if self.high is None else min(total, self.high - self.low)


# -- iterables (the hooks Django's QuerySet evaluates through) --------------------------------------------

class EventIterable(ModelIterable):
    """Model instances, built with `from_db` (no database is touched)."""

    def __iter__(self) -> Iterator[Any]:
        qs = self.queryset
        model = qs.model
        names = [f.attname for f in model._meta.concrete_fields]
        for row in QueryRunner(qs).rows():
            yield model.from_row(qs.db, names, row)


class EventValuesIterable(BaseIterable):
    def __iter__(self) -> Iterator[dict[str, Any]]:
        qs = self.queryset
        names = qs._event_value_names()
        for row in QueryRunner(qs).rows():
            yield {n: row[a] for n, a in names}


class EventValuesListIterable(BaseIterable):
    def __iter__(self) -> Iterator[tuple]:
        qs = self.queryset
        names = qs._event_value_names()
        for row in QueryRunner(qs).rows():
            yield tuple(row[a] for _, a in names)


class EventFlatValuesListIterable(BaseIterable):
    def __iter__(self) -> Iterator[Any]:
        qs = self.queryset
        (_, attname), = qs._event_value_names()
        for row in QueryRunner(qs).rows():
            yield row[attname]


class EventQuerySet(QuerySet):
    """A lazy, chainable QuerySet of an event model's topic (see the module docstring for what is pushed
    down to the store). Writes are appends, through the manager; update and delete are refused."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._iterable_class = EventIterable
        self._scan = False

    def _clone(self) -> EventQuerySet:
        c = super()._clone()
        c._scan = self._scan
        return c

    @property
    def event_store(self) -> EventStore:
        from .connection import stores

        return stores[getattr(self.model, "store_alias", "default")]

    def scan(self) -> EventQuerySet:
        """Allow lookups the store cannot narrow (``data__…``, ``born_at``, ``body__contains``, …) by reading
        every message of the topic that the other lookups leave (explicitly a full scan)."""
        c = self._chain()
        c._scan = True
        return c

    # evaluation that Django would do in SQL
    def count(self) -> int:
        if self._result_cache is not None:
            return len(self._result_cache)
        return QueryRunner(self).count()

    def exists(self) -> bool:
        if self._result_cache is not None:
            return bool(self._result_cache)
        return next(iter(QueryRunner(self._chain()).rows()), None) is not None

    def _event_value_names(self) -> list[tuple[str, str]]:
        opts = self.model._meta
        fields = self._fields or [f.name for f in opts.concrete_fields]
        out = []
        for name in fields:
            if name in self.query.annotations:
                raise _unsupported(f"annotations in values() ({name})")
            try:
                f = opts.pk if name == "pk" else opts.get_field(name)
            except Exception:
                raise _unsupported(f"values() of {name!r}") from None
            out.append((name, f.attname))
        return out

    def values(self, *fields: str, **expressions: Any) -> EventQuerySet:
        if expressions:
            raise _unsupported("expressions in values()")
        c = super().values(*fields)
        c._iterable_class = EventValuesIterable
        return c

    def values_list(self, *fields: str, flat: bool = False, named: bool = False) -> EventQuerySet:
        if named:
            raise _unsupported("values_list(named=True)")
        c = super().values_list(*fields, flat=flat)
        c._iterable_class = EventFlatValuesListIterable if flat else EventValuesListIterable
        return c

    def aggregate(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """Count, Min, Max and Sum of plain fields, computed over the matching events."""
        for arg in args:
            kwargs[arg.default_alias] = arg
        funcs: dict[str, tuple[Any, str | None]] = {}
        for alias, agg in kwargs.items():
            exprs = list(getattr(agg, "source_expressions", agg.get_source_expressions()))
            if type(agg) not in (Count, Min, Max, Sum) or getattr(agg, "filter", None) is not None \
                    or len(exprs) != 1 or getattr(agg, "distinct", False):
                raise _unsupported(f"the aggregate {agg!r} (Count, Min, Max, Sum of a field are)")
            src = exprs[0]
            name = getattr(src, "name", None)
            if name == "*" or (type(agg) is Count and name == "pk"):
                funcs[alias] = (Count, None)
                continue
            if name is None:
                raise _unsupported(f"the aggregate {agg!r}")
            f = self.model._meta.pk if name == "pk" else self.model._meta.get_field(name)
            funcs[alias] = (type(agg), f.attname)
        rows = list(QueryRunner(self.order_by()).rows())
        out: dict[str, Any] = {}
        for alias, (kind, attname) in funcs.items():
            values = [r[attname] for r in rows if attname is None or r[attname] is not None] if attname else rows
            if kind is Count:
                out[alias] = len(values)
            elif kind is Min:
                out[alias] = min(values) if values else None
            elif kind is Max:
                out[alias] = max(values) if values else None
            else:
                out[alias] = sum(values) if values else None
        return out

    def dates(self, field_name: str, kind: str, order: str = "ASC") -> list[datetime.date]:  # type: ignore[override]
        return [d.date() for d in self.datetimes(field_name, kind, order)]

    def datetimes(self, field_name: str, kind: str, order: str = "ASC", tzinfo: Any = None,  # type: ignore[override]
                  is_dst: Any = None) -> list[datetime.datetime]:
        if kind not in ("year", "month", "week", "day", "hour", "minute", "second"):
            raise ValueError("'kind' must be one of 'year', 'month', 'week', 'day', 'hour', 'minute', 'second'.")
        if order not in ("ASC", "DESC"):
            raise ValueError("'order' must be either 'ASC' or 'DESC'.")
        attname = self.model._meta.get_field(field_name).attname
        tz = tzinfo or timezone.get_current_timezone()
        out = set()
        for row in QueryRunner(self.order_by()).rows():
            v = row[attname]
            if v is None:
                continue
            v = v.astimezone(tz)
            if kind == "week":
                v = (v - datetime.timedelta(days=v.weekday())).replace(hour=0, minute=0, second=0, microsecond=0)
            else:
                parts = ["year", "month", "day", "hour", "minute", "second"]
                keep = parts.index(kind) + 1
                v = v.replace(microsecond=0, **{p: (1 if p in ("month", "day") else 0) for p in parts[keep:]})
            out.add(v)
        return sorted(out, reverse=order == "DESC")

    # refused: the log is append-only
    def _refuse(self, what: str) -> NotSupportedError:
        return NotSupportedError(f"{what} is not possible on an event log; events are appended with "
                                 f"{self.model.__name__}.objects.append()")

    def update(self, **kwargs: Any) -> int:
        raise self._refuse("update()")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise self._refuse("delete()")

    def bulk_create(self, *args: Any, **kwargs: Any) -> list[Any]:
        raise self._refuse("bulk_create()")

    def bulk_update(self, *args: Any, **kwargs: Any) -> int:
        raise self._refuse("bulk_update()")

    def create(self, **kwargs: Any) -> Any:
        raise self._refuse("create()")

    def get_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("get_or_create()")

    def update_or_create(self, *args: Any, **kwargs: Any) -> Any:
        raise self._refuse("update_or_create()")

    def select_for_update(self, *args: Any, **kwargs: Any) -> EventQuerySet:
        raise self._refuse("select_for_update()")

    def annotate(self, *args: Any, **kwargs: Any) -> EventQuerySet:
        raise _unsupported("annotate()")

    def alias(self, *args: Any, **kwargs: Any) -> EventQuerySet:
        raise _unsupported("alias()")

    def extra(self, *args: Any, **kwargs: Any) -> EventQuerySet:
        raise _unsupported("extra()")

    def raw(self, *args: Any, **kwargs: Any) -> Any:
        raise _unsupported("raw SQL")

    def explain(self, *args: Any, **kwargs: Any) -> str:
        runner = QueryRunner(self)
        return f"{type(runner.plan).__name__}: {runner.plan!r}; ordering {runner.ordering.keys}"

    def distinct(self, *field_names: str) -> EventQuerySet:
        if field_names:
            raise _unsupported("distinct(fields)")
        return self._chain()  # every event is distinct already (msg_id is the primary key)

    def prefetch_related(self, *lookups: Any) -> EventQuerySet:
        if lookups:
            raise _unsupported("prefetch_related()")
        return self._chain()

    def select_related(self, *fields: Any) -> EventQuerySet:
        return self._chain()  # an event has no relations
