"""Event models: ``class OrderEvent(EventModel): topic = "orders"``.

An event model is an unmanaged Django model (no table) whose rows are the messages of one topic (optionally
only those with tags in ``tag_set``). Its fields mirror the stored record; ``data`` is the body decoded by
the model's codec (JSON by default). ``objects`` is an `EventManager`: QuerySets over the store
(`query.EventQuerySet`) and appends (`append`, `bulk_append`, `aappend`, `abulk_append`).

`EventTransaction` (from ``marker``) is the app's own table (migrated): the marker rows of appends made
inside ``transaction.atomic()`` (see ``transactions``). `Dashboard` (no table) is the admin's entry for the
staff dashboard (``dashboard``).
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

from asgiref.sync import sync_to_async
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models
from django.db.models.base import Model, ModelBase, ModelState
from django.db.models.signals import post_init, pre_init
from django.utils.module_loading import import_string

from ..common.properties import PROPERTY_STREAM_ID, PROPERTY_STREAM_VERSION
from .marker import Dashboard, EventTransaction
from .query import EventQuerySet
from .transactions import append_events

__all__ = ["Dashboard", "EventManager", "EventModel", "EventModelBase", "EventTransaction", "JSONCodec", "RawCodec", "get_codec"]

# RocketMQ's own properties (MessageConst) and ours: shown as fields, or bookkeeping, not user properties
SYSTEM_PROPERTIES = frozenset((
    "KEYS", "TAGS", "UNIQ_KEY", "WAIT", "STREAM_ID", "STREAM_VERSION", "TRAN_MSG", "PGROUP", "REAL_TOPIC",
    "REAL_QID", "TRAN_PREPARED_QUEUE_OFFSET", "MAX_OFFSET", "MIN_OFFSET", "CLUSTER", "MSG_REGION", "TRACE_ON",
    "DELAY", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "RECONSUME_TIME", "MAX_RECONSUME_TIMES", "CHECK_IMMUNITY_TIME_IN_SECONDS",
    "TRANSACTION_CHECK_TIMES", "TIMER_DELIVER_MS", "TIMER_DELAY_SEC", "TIMER_DELAY_MS", "TIMER_OUT_MS",
    "TIMER_ENQUEUE_MS", "TIMER_DEQUEUE_MS", "TIMER_ROLL_TIMES", "POP_CK", "__CRC32#", "DJANGO_DB",
))


class JSONCodec:
    """The default codec: ``data`` ↔ UTF-8 JSON (Django's encoder: datetimes, decimals, UUIDs)."""

    content_type = "application/json"

    # one encoder for every call: json.dumps(data, cls=..., ...) would build this same one per call
    _encoder = DjangoJSONEncoder(separators=(",", ":"), ensure_ascii=False)

    def encode(self, data: Any) -> bytes:
        """``data`` as UTF-8 JSON: what ``_encoder.encode(data)`` makes. For anything but a str, the C encoder
        `JSONEncoder.iterencode` makes for a one-shot call (a fresh circular-reference check per call) is made
        here directly, without ``encode`` / ``iterencode``'s Python frames."""
        e = self._encoder
        if _c_make_encoder is None or data.__class__ is str:
            return e.encode(data).encode()
        return "".join(_c_make_encoder({}, e.default, _encode_basestring, None, e.key_separator, e.item_separator,
                                       e.sort_keys, e.skipkeys, e.allow_nan)(data, 0)).encode()

    def decode(self, body: bytes) -> Any:
        """The JSON value of ``body`` (``json.loads``), or None when it is not JSON. A body whose first two
        bytes make ``json.detect_encoding`` say UTF-8 (no BOM, no NUL among them) is decoded as UTF-8 here,
        as ``json.loads`` would decode it."""
        try:
            if body.__class__ is bytes and len(body) > 1 and body[0] not in _NOT_PLAIN_UTF8 and body[1]:
                return json.loads(body.decode("utf-8", "surrogatepass"))
            return json.loads(body)
        except (ValueError, UnicodeDecodeError):
            return None  # not JSON (written by another producer): `body` still has the bytes


_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_encode_basestring = json.encoder.encode_basestring  # ensure_ascii=False's string encoder (C when built)
_NOT_PLAIN_UTF8 = frozenset((0, 0xEF, 0xFE, 0xFF))  # the first bytes of a BOM or of UTF-16/32 text


class RawCodec:
    """``data`` is the body's bytes as text (UTF-8, undecodable bytes replaced); appends take str or bytes."""

    content_type = "application/octet-stream"

    def encode(self, data: Any) -> bytes:
        return data if isinstance(data, bytes) else str(data).encode()

    def decode(self, body: bytes) -> Any:
        return bytes(body).decode("utf-8", "replace")


CODECS: dict[str, Any] = {"json": JSONCodec(), "raw": RawCodec()}


def get_codec(spec: Any) -> Any:
    """A codec from a name (``json``, ``raw``), a dotted path to a codec object or class, or an object with
    ``encode(data) -> bytes`` and ``decode(body) -> data``."""
    if isinstance(spec, str):
        if spec in CODECS:
            return CODECS[spec]
        obj = import_string(spec)
        return obj() if isinstance(obj, type) else obj
    if not (hasattr(spec, "encode") and hasattr(spec, "decode")):
        raise TypeError(f"a codec needs encode(data) -> bytes and decode(body) -> data, not {spec!r}")
    return spec


def _aware(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)


class EventModelBase(ModelBase):
    """Keeps event models unmanaged (no table, no migration operations beyond the model state) and checks
    what a subclass declares."""

    def __new__(mcs, name: str, bases: tuple, attrs: dict[str, Any], **kwargs: Any) -> Any:
        cls = super().__new__(mcs, name, bases, attrs, **kwargs)
        if not cls._meta.abstract:
            cls._meta.managed = False
            tags = getattr(cls, "tag_set", None)
            if isinstance(tags, str):
                cls.tag_set = frozenset([tags])
            elif tags is not None:
                cls.tag_set = frozenset(tags)
        return cls


class EventManager(models.Manager.from_queryset(EventQuerySet)):  # type: ignore[misc]
    """QuerySets over the model's topic, and appends. Inside ``transaction.atomic()`` an append is a half
    message plus a marker row in the same database transaction (visible when the database commits);
    outside, a plain send."""

    def get_queryset(self) -> EventQuerySet:
        return EventQuerySet(self.model, using=self._db)

    def append(self, data: Any = None, *, keys: str | Sequence[str] | None = None, tags: str | None = None,
               stream: str | None = None, expected_version: int | None = None, body: bytes | None = None,
               properties: dict[str, str] | None = None, using: str | None = None) -> EventModel:
        """Append one event to the model's topic and return it: ``msg_id``, queue, offsets and, for a stream,
        its ``version``. ``born_at``/``stored_at`` are None until read back (``refresh_from_db()``); inside a
        transaction the offsets are those of the half message until the commit.

        ``keys`` (one or a list) are indexed; ``stream`` numbers the event within its stream and
        ``expected_version`` (0: the stream must not exist) makes the append conditional: another current
        version raises `rmq_eventstore.django.ConcurrencyError`. ``body`` bypasses the codec."""
        return append_events(self.model, [(data, keys, tags, body, properties)], stream, expected_version, using)[0]

    def bulk_append(self, items: Iterable[Any], *, keys: str | Sequence[str] | None = None, tags: str | None = None,
                    stream: str | None = None, expected_version: int | None = None,
                    using: str | None = None) -> list[EventModel]:
        """Append several events at once: one batch on one queue, consecutive offsets, all or none. Each item
        is the event's ``data``, or a dict ``{"data": ..., "keys": ..., "tags": ...}`` when the keys or tags
        differ per event. With ``stream``, they are the stream's next events (versions in order)."""
        rows = []
        for item in items:
            if isinstance(item, dict) and "data" in item and set(item) <= {"data", "keys", "tags", "body", "properties"}:
                rows.append((item.get("data"), item.get("keys", keys), item.get("tags", tags), item.get("body"),
                             item.get("properties")))
            else:
                rows.append((item, keys, tags, None, None))
        if not rows:
            return []
        return append_events(self.model, rows, stream, expected_version, using)

    async def aappend(self, data: Any = None, **kwargs: Any) -> EventModel:
        return await sync_to_async(self.append)(data, **kwargs)

    async def abulk_append(self, items: Iterable[Any], **kwargs: Any) -> list[EventModel]:
        return await sync_to_async(self.bulk_append)(list(items), **kwargs)


class EventModel(models.Model, metaclass=EventModelBase):
    """The base of event models: ``class OrderEvent(EventModel): topic = "orders"``.

    Class attributes: ``topic`` (required), ``tag_set`` (only events with these tags; appends default to the
    single tag when there is one), ``store_alias`` (an alias of ``RMQ_EVENTSTORE``), ``codec`` (``"json"``,
    ``"raw"``, a dotted path or a codec object; default: the alias's ``CODEC`` option). Rows are read-only
    and have no table: the store is the source of truth."""

    msg_id = models.CharField("message id", max_length=64, primary_key=True,
                              help_text="RocketMQ's msgId (UNIQ_KEY), or the offsetMsgId of a message without one")
    queue_id = models.IntegerField("queue")
    queue_offset = models.BigIntegerField("queue offset")
    commit_log_offset = models.BigIntegerField("commitlog offset", unique=True)
    born_at = models.DateTimeField("born at")
    stored_at = models.DateTimeField("stored at")
    keys = models.CharField(max_length=4096, blank=True, default="",
                            help_text="the message's keys, space-separated (each one is indexed)")
    tags = models.CharField(max_length=255, blank=True, null=True)
    stream = models.CharField(max_length=255, blank=True, null=True)
    version = models.BigIntegerField(blank=True, null=True, help_text="the event's number within its stream")
    properties = models.JSONField(default=dict, blank=True, encoder=DjangoJSONEncoder)
    body = models.BinaryField(default=b"")
    data = models.JSONField(null=True, blank=True, encoder=DjangoJSONEncoder, help_text="the body, decoded")

    topic: ClassVar[str]
    tag_set: ClassVar[frozenset[str] | None] = None
    store_alias: ClassVar[str] = "default"
    codec: ClassVar[Any] = None

    objects = EventManager()

    class Meta:
        abstract = True
        managed = False
        ordering = ["commit_log_offset"]
        base_manager_name = "objects"

    def __str__(self) -> str:
        where = f"{self.stream}@{self.version}" if self.stream else f"q{self.queue_id}:{self.queue_offset}"
        return f"{type(self).__name__} {self.msg_id} ({where})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError(f"events are immutable; append new ones with {type(self).__name__}.objects.append()")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise TypeError("events are never deleted one by one; the store expires whole files (fileReservedTime)")

    @classmethod
    def get_codec(cls) -> Any:
        spec = cls.codec
        if spec is None:
            from .conf import store_settings

            spec = store_settings(cls.store_alias).options.get("CODEC", "json")
        return get_codec(spec)

    @classmethod
    def row_from_message(cls, m: Any) -> dict[str, Any]:
        """The field values (by attname) of a stored message."""
        props = m.properties
        stream = props.get(PROPERTY_STREAM_ID)
        version = props.get(PROPERTY_STREAM_VERSION)
        keys = [k for k in (props.get("KEYS") or "").split(" ") if k]
        if stream is not None and stream in keys and keys[-1] == stream:
            keys = keys[:-1]  # the broker adds the stream id to the keys so the index finds the stream
        body = bytes(m.body)
        codec = cls._codec_cache()
        return {
            "msg_id": m.uniq_key or m.msg_id, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
            "commit_log_offset": m.commit_log_offset, "born_at": _aware(m.born_timestamp),
            "stored_at": _aware(m.store_timestamp), "keys": " ".join(keys), "tags": props.get("TAGS"),
            "stream": stream, "version": int(version) if version and version.isdigit() else None,
            "properties": {k: v for k, v in props.items() if k not in SYSTEM_PROPERTIES},
            "body": body, "data": codec.decode(body),
        }

    @classmethod
    def _codec_cache(cls) -> Any:
        c = cls.__dict__.get("_resolved_codec")
        if c is None:
            c = cls.get_codec()
            cls._resolved_codec = c
        return c

    @classmethod
    def from_row(cls, db: str | None, attnames: list[str], row: dict[str, Any]) -> EventModel:
        """The instance ``from_db(db, attnames, values)`` makes of `row` (values by attname), its ``topic`` set.
        When `attnames` are all the model's concrete fields in order, nothing runs in Django's ``__init__`` but
        the stores (no ``pre_init`` / ``post_init`` listener, neither ``__init__`` nor ``from_db`` overridden, no
        data descriptor on the names) and the instance's dict is filled as ``__init__`` and ``from_db`` fill it
        (``_state``, then each field; ``_state.adding`` False, ``_state.db``): a third of the work, once per
        append and per row read."""
        names = _plain_init_names(cls)
        if (names is not None and (attnames is names or attnames == names) and cls.__init__ is _MODEL_INIT
                and cls.from_db.__func__ is _MODEL_FROM_DB  # type: ignore[attr-defined]
                and (not pre_init.receivers or not pre_init.has_listeners(cls))
                and (not post_init.receivers or not post_init.has_listeners(cls))):
            obj = _object_new(cls)
            state = ModelState()
            state.adding = False
            state.db = db
            d = obj.__dict__
            d["_state"] = state
            d.update(zip(names, map(row.__getitem__, names), strict=True))
            d["topic"] = cls.topic
            return obj
        obj = cls.from_db(db, attnames, [row[a] for a in attnames])
        obj.topic = cls.topic
        return obj

    @property
    def offset_msg_id(self) -> str:
        return self.msg_id


_MODEL_INIT = Model.__init__
_MODEL_FROM_DB = Model.from_db.__func__  # type: ignore[attr-defined]
_object_new = object.__new__


def _plain_init_names(cls: type[EventModel]) -> list[str] | None:
    """The concrete fields' attnames of `cls` when setting them (and ``_state``, ``topic``) on an instance is
    a plain store into its dict (no data descriptor on the class; ``object.__new__`` makes it), else None;
    found once per class."""
    found = cls.__dict__.get("_rmq_plain_init")
    if found is None:
        names = [f.attname for f in cls._meta.concrete_fields]
        plain = cls.__new__ is object.__new__ and not any(
            hasattr(type(getattr(cls, n, None)), "__set__") for n in (*names, "_state", "topic"))
        found = names if plain else False
        cls._rmq_plain_init = found
    return found or None
