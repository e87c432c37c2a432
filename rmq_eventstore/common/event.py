"""`Event`: a stored message as an event handler sees it (identity, place in the log and in its stream, the
body decoded from JSON when it is JSON)."""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from .message import MessageExt


@dataclass(frozen=True)
class Event:
    """What a handler receives: the message's identity, place in the log and stream, and its decoded body
    (``data``: JSON when the body is JSON, else None; ``body`` has the bytes)."""

    msg_id: str
    topic: str
    queue_id: int
    queue_offset: int
    commit_log_offset: int
    stored_at: datetime.datetime
    tags: str | None
    keys: tuple[str, ...]
    stream: str | None
    version: int | None
    body: bytes
    data: Any
    reconsume_times: int = 0
    properties: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_message(cls, m: MessageExt) -> Event:
        props = m.properties
        body = bytes(m.body)
        try:
            data = json.loads(body)
        except (ValueError, UnicodeDecodeError):
            data = None
        stream, version = props.get("STREAM_ID"), props.get("STREAM_VERSION")
        keys = tuple(k for k in (props.get("KEYS") or "").split(" ") if k and k != stream)
        return cls(m.uniq_key or m.msg_id, m.topic, m.queue_id, m.queue_offset, m.commit_log_offset,
                   datetime.datetime.fromtimestamp(m.store_timestamp / 1000, datetime.UTC), props.get("TAGS"), keys,
                   stream, int(version) if version and version.isdigit() else None, body, data,
                   m.reconsume_times, dict(props))
