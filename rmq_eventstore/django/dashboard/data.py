"""What the dashboard shows, read from a store alias's brokers through the client `Admin` (no state here).

Every function takes an `EventStore` (``stores[alias]``) and returns plain values for the templates; the
requests are RocketMQ's own where they exist, so the pages work on an Apache RocketMQ cluster too, except the
history (our GET_BROKER_STATS_HISTORY).
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from typing import Any

from django.apps import apps

from ...client import ExtensionNotSupportedError, MessageExt
from ...client.remoting_client import MQBrokerError
from ...common import codec
from ...remoting import ResponseCode
from ..connection import READER_GROUP, EventStore

SYSTEM_TOPIC_PREFIXES = ("rmq_sys_", "RMQ_SYS_", "%RETRY%", "%DLQ%", "TBW102", "SCHEDULE_TOPIC_", "TRANS_CHECK_",
                         "OFFSET_MOVED_EVENT", "SELF_TEST_TOPIC", "BenchmarkTest", "DefaultCluster", "broker-")
SYSTEM_GROUP_PREFIXES = ("CID_RMQ_SYS", "CID_ONSAPI", "CID_SYS_", "TOOLS_CONSUMER", "FILTERSRV_CONSUMER",
                         "SELF_TEST_C_GROUP", "CID_ONS-HTTP-PROXY", "rmq_sys_")
MAX_LOOKUP_RESULTS = 50
_HEX = re.compile(r"^[0-9A-Fa-f]+$")


def is_system_topic(topic: str) -> bool:
    return topic.startswith(SYSTEM_TOPIC_PREFIXES)


def is_system_group(group: str) -> bool:
    """RocketMQ's own groups, and the Django face's reader (it pulls for QuerySets and never commits)."""
    return group.startswith(SYSTEM_GROUP_PREFIXES) or group == READER_GROUP


def ms_to_datetime(ms: Any) -> datetime.datetime | None:
    try:
        value = int(ms)
    except (TypeError, ValueError):
        return None
    if value <= 0:
        return None
    return datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)


def _float(value: Any, default: float = -1.0) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


# -- overview ------------------------------------------------------------------------------------------
@dataclass
class BrokerHealth:
    name: str
    address: str
    info: dict[str, str]
    checkpoints: list[tuple[str, datetime.datetime | None]] = field(default_factory=list)
    disk_percent: float = -1.0
    watermarks: list[tuple[str, float]] = field(default_factory=list)
    disk_level: str = "ok"  # ok / warn / full

    @property
    def commit_log_bytes(self) -> int:
        return int(self.info.get("commitLogMaxOffset", 0) or 0) - int(self.info.get("commitLogMinOffset", 0) or 0)


def broker_health(store: EventStore) -> list[BrokerHealth]:
    out = []
    for name, addr in sorted(store.admin.broker_addresses().items()):
        info = store.admin.runtime_info(addr)
        h = BrokerHealth(name, addr, info)
        h.checkpoints = [(label, ms_to_datetime(info.get(key))) for label, key in (
            ("commitlog (physicMsgTimestamp)", "physicMsgTimestamp"),
            ("consume queues (logicsMsgTimestamp)", "logicsMsgTimestamp"),
            ("index (indexMsgTimestamp)", "indexMsgTimestamp"))]
        ratio = _float(info.get("commitLogDiskRatio"))
        h.disk_percent = round(ratio * 100, 1) if ratio >= 0 else -1.0
        for label, key in (("diskMaxUsedSpaceRatio", "diskMaxUsedSpaceRatio"),
                           ("diskSpaceCleanForciblyRatio", "diskSpaceCleanForciblyRatio"),
                           ("diskSpaceWarningLevelRatio", "diskSpaceWarningLevelRatio")):
            if key in info:
                h.watermarks.append((label, _float(info[key])))
        marks = dict(h.watermarks)
        if info.get("diskFull") == "true" or (
                "diskSpaceWarningLevelRatio" in marks and h.disk_percent >= marks["diskSpaceWarningLevelRatio"]):
            h.disk_level = "full"
        elif "diskMaxUsedSpaceRatio" in marks and h.disk_percent >= marks["diskMaxUsedSpaceRatio"]:
            h.disk_level = "warn"
        out.append(h)
    return out


# -- topics ----------------------------------------------------------------------------------------------
@dataclass
class TopicRow:
    topic: str
    queues: list[Any]
    error: str = ""

    @property
    def count(self) -> int:
        return sum(q.count for q in self.queues)

    @property
    def max_offset(self) -> int:
        return sum(q.max_offset for q in self.queues)

    @property
    def last_update(self) -> datetime.datetime | None:
        return ms_to_datetime(max((q.last_update_timestamp for q in self.queues), default=0))


def topic_rows(store: EventStore, include_system: bool = False) -> list[TopicRow]:
    rows = []
    for topic in sorted(store.admin.topic_list()):
        if not include_system and is_system_topic(topic):
            continue
        try:
            rows.append(TopicRow(topic, store.admin.topic_stats(topic)))
        except (MQBrokerError, ValueError) as e:
            rows.append(TopicRow(topic, [], str(e)))
    return rows


# -- consumer groups -------------------------------------------------------------------------------------
@dataclass
class GroupRow:
    group: str
    topics: list[str]
    stats: Any = None
    error: str = ""

    @property
    def lag(self) -> int:
        return self.stats.lag if self.stats is not None else 0


def group_rows(store: EventStore, include_system: bool = False) -> list[GroupRow]:
    rows = []
    for group, topics in store.admin.consumer_groups().items():
        if not include_system and is_system_group(group):
            continue
        row = GroupRow(group, topics)
        try:
            row.stats = store.admin.consume_stats(group)
        except MQBrokerError as e:
            row.error = str(e)
        rows.append(row)
    return rows


# -- lookup ----------------------------------------------------------------------------------------------
def event_model_for(alias: str, topic: str, tags: str | None) -> Any:
    """The event model of `alias` over `topic` that would show this message (tag filters respected)."""
    from ..models import EventModel

    best = None
    for model in apps.get_models():
        if not issubclass(model, EventModel) or getattr(model, "topic", None) != topic:
            continue
        if getattr(model, "store_alias", "default") != alias:
            continue
        tag_set = getattr(model, "tag_set", None)
        if tag_set is None:
            best = best or model
        elif tags in tag_set:
            return model
    return best


@dataclass
class FoundMessage:
    message: MessageExt
    model: Any = None
    row: dict[str, Any] = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.model.__name__ if self.model is not None else ""

    @property
    def body_text(self) -> str:
        body = bytes(self.message.body or b"")
        text = body[:8192].decode("utf-8", "replace")
        return text + (f" … ({len(body)} bytes)" if len(body) > 8192 else "")

    @property
    def data_json(self) -> str | None:
        if self.model is not None:
            data = self.row.get("data")
            return None if data is None else json.dumps(data, indent=2, ensure_ascii=False, default=str)
        try:
            return json.dumps(json.loads(bytes(self.message.body or b"")), indent=2, ensure_ascii=False)
        except (ValueError, UnicodeDecodeError):
            return None

    @property
    def properties_json(self) -> str:
        return json.dumps(dict(self.message.properties), indent=2, ensure_ascii=False, sort_keys=True)

    @property
    def stored_at(self) -> datetime.datetime | None:
        return ms_to_datetime(self.message.store_timestamp)

    @property
    def born_at(self) -> datetime.datetime | None:
        return ms_to_datetime(self.message.born_timestamp)


def _decorate(alias: str, messages: list[MessageExt]) -> list[FoundMessage]:
    out = []
    for m in messages[:MAX_LOOKUP_RESULTS]:
        model = event_model_for(alias, m.topic, m.properties.get("TAGS"))
        row = {}
        if model is not None:
            try:
                row = model.row_from_message(m)
            except Exception:  # a body the model's codec cannot read: the raw fields still show
                model = None
        out.append(FoundMessage(m, model, row))
    return out


def _by_offset_msg_id(store: EventStore, msg_id: str) -> MessageExt | None:
    """The message an offsetMsgId names, asked only of a broker of this store (the id's host and port must
    be one of them: a web form never makes the server connect elsewhere)."""
    try:
        host, port, offset = codec.decode_message_id(msg_id)
    except Exception:
        return None
    address = codec.format_host(host, port)
    if address not in store.admin.broker_addresses().values():
        return None
    return store.admin.view_message_at(None, offset) if offset >= 0 else None


def lookup(store: EventStore, kind: str, value: str, topic: str = "") -> list[FoundMessage]:
    """Messages by ``key`` (needs the topic), ``msgid`` (UNIQ_KEY through the index, or an offsetMsgId) or
    ``offset`` (a commitlog offset). `ValueError` says what is missing or malformed."""
    admin = store.admin
    value = value.strip()
    if not value:
        raise ValueError("enter a key, message id or commitlog offset")
    if kind == "key":
        if not topic:
            raise ValueError("a lookup by key needs the topic")
        msgs = admin.query_key_all(topic, value, MAX_LOOKUP_RESULTS)
    elif kind == "offset":
        try:
            offset = int(value)
        except ValueError:
            raise ValueError(f"{value!r} is not a commitlog offset (a whole number)") from None
        m = admin.view_message_at(topic or None, offset)
        msgs = [m] if m is not None else []
    elif kind == "msgid":
        if not _HEX.match(value):
            raise ValueError(f"{value!r} is not a message id (hexadecimal)")
        msgs = []
        topics = [topic] if topic else [t for t in admin.topic_list() if not is_system_topic(t)][:50]
        for t in topics:  # UNIQ_KEY (the producer's msgId) is in the index
            try:
                msgs = [m for m in admin.query_message(t, value, 4) if (m.uniq_key or "").upper() == value.upper()]
            except MQBrokerError as e:
                if e.code not in (ResponseCode.TOPIC_NOT_EXIST, ResponseCode.QUERY_NOT_FOUND):
                    raise
            if msgs:
                break
        if not msgs:  # an offsetMsgId: store host, port and commitlog offset
            m = _by_offset_msg_id(store, value)
            msgs = [m] if m is not None and (not topic or m.topic == topic) else []
    else:
        raise ValueError(f"unknown lookup {kind!r}: key, msgid or offset")
    msgs.sort(key=lambda m: m.commit_log_offset)
    return _decorate(store.alias, msgs)


# -- charts ----------------------------------------------------------------------------------------------
def chart_series(store: EventStore, max_groups: int = 8) -> dict[str, Any]:
    """The broker history as series for the charts: put throughput (messages/s between samples), dispatch
    backlog (bytes) and the lag of the groups with the most lag (messages). Timestamps in ms."""
    admin = store.admin
    out: dict[str, Any] = {"alias": store.alias, "brokers": []}
    for name, addr in sorted(admin.broker_addresses().items()):
        try:
            h = admin.stats_history(addr)
        except ExtensionNotSupportedError as e:
            out["brokers"].append({"broker": name, "error": str(e)})
            continue
        samples = h.get("samples") or []
        tput = []
        for a, b in zip(samples, samples[1:], strict=False):
            dt = (b["t"] - a["t"]) / 1000.0
            if dt > 0:
                tput.append([b["t"], round(max(b["msgPutTotal"] - a["msgPutTotal"], 0) / dt, 3)])
        groups: dict[str, list[list[int]]] = {}
        for s in samples:
            for g, lag in (s.get("groupLag") or {}).items():
                if not is_system_group(g):
                    groups.setdefault(g, []).append([s["t"], lag])
        top = sorted(groups, key=lambda g: (-max(v for _, v in groups[g]), g))[:max_groups]
        out["brokers"].append({
            "broker": name, "intervalMillis": h.get("intervalMillis"), "samples": len(samples),
            "throughput": tput, "dispatchBehind": [[s["t"], s["dispatchBehindBytes"]] for s in samples],
            "lag": {g: groups[g] for g in sorted(top)},
        })
    return out
