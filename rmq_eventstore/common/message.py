"""What goes into the store (`Message`) and what comes out of it (`MessageExt`).

Field names follow RocketMQ's `Message` / `MessageExt`. The byte layout lives in `codec.py` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .message_id import create_message_id, format_host
from .properties import string_to_properties
from .sysflag import MESSAGE_MAGIC_CODE_V2
from .tags import tags_string_to_tags_code


@dataclass(slots=True)
class Message:
    """A message to append: topic, body, and the optional tags, keys and user properties.

    `properties_string`, when given, is stored verbatim (as a RocketMQ broker stores what the producer
    sent) and takes the place of `tags`, `keys` and `properties`. `born_host` is `"ip:port"` or
    `"[v6]:port"`; left empty, the store host is used. `born_timestamp` 0 means "now".
    """

    topic: str
    body: bytes = b""
    tags: str | None = None
    keys: str | Sequence[str] | None = None
    queue_id: int = 0
    flag: int = 0
    properties: dict[str, str] | None = None
    sys_flag: int = 0
    born_timestamp: int = 0
    born_host: str | None = None
    reconsume_times: int = 0
    prepared_transaction_offset: int = 0
    properties_string: str | None = None
    uniq_key: str | None = None
    force_v2: bool = False

    def keys_list(self) -> list[str]:
        k = self.keys
        if not k:
            return []
        if isinstance(k, str):
            return [t for t in k.split(" ") if t]
        return [t for t in k if t]


class MessageExt:
    """A record decoded from the commitlog: every header field plus body, topic and properties.

    The properties map is parsed on first access; hosts are kept as packed bytes and formatted on
    demand (`born_host`, `store_host` give Java's `ip:port` text), so a pull that only needs bodies pays
    for nothing else.
    """

    __slots__ = (
        "store_size", "magic_code", "body_crc", "queue_id", "flag", "queue_offset", "commit_log_offset",
        "sys_flag", "born_timestamp", "born_host_bytes", "born_port", "store_timestamp",
        "store_host_bytes", "store_port", "reconsume_times", "prepared_transaction_offset", "body",
        "topic", "properties_string", "_properties",
    )

    def __init__(
        self, store_size: int, magic_code: int, body_crc: int, queue_id: int, flag: int,
        queue_offset: int, commit_log_offset: int, sys_flag: int, born_timestamp: int,
        born_host_bytes: bytes, born_port: int, store_timestamp: int, store_host_bytes: bytes,
        store_port: int, reconsume_times: int, prepared_transaction_offset: int, body: bytes,
        topic: str, properties_string: str,
    ) -> None:
        self.store_size = store_size
        self.magic_code = magic_code
        self.body_crc = body_crc
        self.queue_id = queue_id
        self.flag = flag
        self.queue_offset = queue_offset
        self.commit_log_offset = commit_log_offset
        self.sys_flag = sys_flag
        self.born_timestamp = born_timestamp
        self.born_host_bytes = born_host_bytes
        self.born_port = born_port
        self.store_timestamp = store_timestamp
        self.store_host_bytes = store_host_bytes
        self.store_port = store_port
        self.reconsume_times = reconsume_times
        self.prepared_transaction_offset = prepared_transaction_offset
        self.body = body
        self.topic = topic
        self.properties_string = properties_string
        self._properties: dict[str, str] | None = None

    @property
    def properties(self) -> dict[str, str]:
        p = self._properties
        if p is None:
                p = self._properties = string_to_properties(self.properties_string)
        return p

    def get_property(self, name: str) -> str | None:
        return self.properties.get(name)

    @property
    def tags(self) -> str | None:
        return self.properties.get("TAGS")

    @property
    def keys(self) -> str | None:
        return self.properties.get("KEYS")

    def keys_list(self) -> list[str]:
        k = self.keys
        return [t for t in k.split(" ") if t] if k else []

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get("UNIQ_KEY")

    @property
    def version(self) -> str:
        return "V2" if self.magic_code == MESSAGE_MAGIC_CODE_V2 else "V1"

    @property
    def tags_code(self) -> int:
        return tags_string_to_tags_code(self.tags)

    @property
    def born_host(self) -> str:
        return format_host(self.born_host_bytes, self.born_port)

    @property
    def store_host(self) -> str:
        return format_host(self.store_host_bytes, self.store_port)

    @property
    def msg_id(self) -> str:
        """The broker's offsetMsgId: store host + port + commitlog offset, upper-case hex."""
        return create_message_id(self.store_host_bytes, self.store_port, self.commit_log_offset)

    offset_msg_id = msg_id

    @property
    def client_msg_id(self) -> str:
        """What a RocketMQ client calls `msgId`: UNIQ_KEY when present, else the offsetMsgId."""
        return self.uniq_key or self.msg_id

    def to_dict(self, body: str = "text") -> dict[str, object]:
        """A JSON-ready dict (body as UTF-8 text with replacement, hex, or omitted)."""
        d: dict[str, object] = {
            "msgId": self.msg_id, "topic": self.topic, "queueId": self.queue_id,
            "queueOffset": self.queue_offset, "commitLogOffset": self.commit_log_offset,
            "storeSize": self.store_size, "version": self.version, "bodyCRC": self.body_crc,
            "flag": self.flag, "sysFlag": self.sys_flag, "bornTimestamp": self.born_timestamp,
            "bornHost": self.born_host, "storeTimestamp": self.store_timestamp,
            "storeHost": self.store_host, "reconsumeTimes": self.reconsume_times,
            "preparedTransactionOffset": self.prepared_transaction_offset, "tags": self.tags,
            "tagsCode": self.tags_code, "keys": self.keys, "uniqKey": self.uniq_key,
            "properties": self.properties, "bodyLength": len(self.body),
        }
        if body == "text":
            d["body"] = bytes(self.body).decode("utf-8", "replace")
        elif body == "hex":
            d["bodyHex"] = bytes(self.body).hex()
        return d

    def __repr__(self) -> str:
        return (
            f"MessageExt(topic={self.topic!r}, queue_id={self.queue_id}, queue_offset={self.queue_offset},"
            f" commit_log_offset={self.commit_log_offset}, store_size={self.store_size},"
            f" body={bytes(self.body[:32])!r}{'...' if len(self.body) > 32 else ''})"
        )
