"""Expected rows: what the engine's own reader (`StoreReader` → `MessageExt`) returns, as plain dicts."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from rmq_eventstore.store import MessageExt, StoreReader


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


def message_row(m: MessageExt) -> dict[str, Any]:
    """One `MessageExt` in the DataFrame's column names and types (timestamps as UTC datetimes)."""
    return {
        "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "commit_log_offset": m.commit_log_offset, "store_size": m.store_size, "sys_flag": m.sys_flag,
        "flag": m.flag, "born_timestamp": _ts(m.born_timestamp), "born_host": m.born_host,
        "store_timestamp": _ts(m.store_timestamp), "store_host": m.store_host,
        "reconsume_times": m.reconsume_times, "prepared_transaction_offset": m.prepared_transaction_offset,
        "tags": m.tags, "keys": m.keys, "uniq_key": m.uniq_key, "properties": dict(m.properties),
        "body": bytes(m.body), "msg_id": m.msg_id,
    }


def engine_rows(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every message of a store (root or bare commitlog directory), via the engine, in log order."""
    with StoreReader(path) as reader:
        return [message_row(m) for m in reader.iter_messages()]


def normalise(row: dict[str, Any]) -> dict[str, Any]:
    """A DataFrame/Arrow row made comparable: map as dict, body as bytes, timestamps in UTC."""
    out = dict(row)
    props = out["properties"]
    out["properties"] = dict(props) if props is not None else {}
    out["body"] = bytes(out["body"])
    for k in ("born_timestamp", "store_timestamp"):
        v = out[k]
        out[k] = v.astimezone(UTC)  # Spark hands out naive local times; astimezone reads them as local
    return out


def by_offset(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted((normalise(r) for r in rows), key=lambda r: r["commit_log_offset"])
