"""The broker's JSON config files under `<root>/config/` (spec §13), byte-compatible with RocketMQ 5.x.

* `write_config_file` / `read_config_file`: crash-safe persistence with a `.bak` copy of the previous
  content, read back exactly like `ConfigManager.load` (main file, then `.bak`) (§13.1).
* `ConfigManager` and the four files: `TopicConfigManager` (topics.json), `ConsumerOffsetManager`
  (consumerOffset.json), `SubscriptionGroupManager` (subscriptionGroup.json) and `DelayOffsetManager`
  (delayOffset.json).  They read what 4.x and every 5.x write and write what 5.x writes.

The JSON dialect lives in `rmq_eventstore.common.fastjson` and the beans (`TopicConfig`,
`SubscriptionGroupConfig`, `PermName`, `DataVersion`) in `rmq_eventstore.common.topic_config`, because
clients and tools read them too; both are re-exported here.
"""

from __future__ import annotations

import logging
import os
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

from ..common.fastjson import (
    Bean,
    ConfigFileError,
    Encoded,
    as_int,
    as_object,
    as_str,
    fastjson_dumps,
    fastjson_encode_at,
    fastjson_loads,
    int_long_map,
    opt_object,
)
from ..common.topic import validate_group, validate_topic
from ..common.topic_config import DataVersion, PermName, SubscriptionGroupConfig, TopicConfig
from .fsutil import fsync_directory

__all__ = [
    "CONSUMER_OFFSET_FILE",
    "DELAY_OFFSET_FILE",
    "SUBSCRIPTION_GROUP_FILE",
    "TOPICS_FILE",
    "TOPIC_GROUP_SEPARATOR",
    "Bean",
    "ConfigFileError",
    "ConfigManager",
    "ConsumerOffsetManager",
    "DataVersion",
    "DelayOffsetManager",
    "PermName",
    "SubscriptionGroupConfig",
    "SubscriptionGroupManager",
    "TopicConfig",
    "TopicConfigManager",
    "fastjson_dumps",
    "fastjson_loads",
    "read_config_file",
    "write_config_file",
]

log = logging.getLogger(__name__)

TOPICS_FILE = "topics.json"
CONSUMER_OFFSET_FILE = "consumerOffset.json"
SUBSCRIPTION_GROUP_FILE = "subscriptionGroup.json"
DELAY_OFFSET_FILE = "delayOffset.json"
TOPIC_GROUP_SEPARATOR = "@"


# ---------------------------------------------------------------------------------------------------
# crash-safe files
# ---------------------------------------------------------------------------------------------------

_path_locks: dict[str, threading.Lock] = {}
_path_locks_guard = threading.Lock()


def _lock_for(path: str) -> threading.Lock:
    key = os.path.abspath(path)
    with _path_locks_guard:
        lock = _path_locks.get(key)
        if lock is None:
            lock = _path_locks[key] = threading.Lock()
        return lock


_fsync_dir = fsync_directory


def _write_durably(target: str, data: bytes) -> None:
    """Write `data` to `target + ".tmp"`, fsync it and rename it onto `target` (atomic on POSIX)."""
    tmp = target + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, target)


def write_config_file(path: str | os.PathLike[str], text: str) -> None:
    """Persist `text` (UTF-8, no trailing newline added) to `path` the crash-safe way.

    Like RocketMQ's `MixAll.string2File`, the current content of `path` (if the file exists, even when
    empty) is first copied to `path.bak`; unlike it, both files are replaced atomically (write `.tmp`,
    fsync, rename) and the directory is fsynced, so a crash leaves `path` holding either the old or the
    new complete content, never a torn one.  Parent directories are created.  Thread-safe per path.
    """
    target = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(target))
    data = text.encode("utf-8")
    with _lock_for(target):
        os.makedirs(directory, exist_ok=True)
        try:
            with open(target, "rb") as f:
                previous: bytes | None = f.read()
        except FileNotFoundError:
            previous = None
        if previous is not None:
            _write_durably(target + ".bak", previous)
        _write_durably(target, data)
        _fsync_dir(directory)


def _read_nonempty_text(path: str) -> str | None:
    """The file's text, or None if it is missing or empty; raises on unreadable or non-UTF-8 content."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    if not data:
        return None
    return data.decode("utf-8")


def read_config_file(
    path: str | os.PathLike[str],
    validate: Callable[[str], Any] | None = fastjson_loads,
) -> str | None:
    """Read a config file the way `ConfigManager.load` does (spec §13.1) and return the text used.

    `path` is used if it exists, is non-empty, is UTF-8 and `validate(text)` does not raise; otherwise
    `path.bak` is tried.  Returns None when the chosen file is missing or empty (start empty, as RocketMQ
    does) and raises `ConfigFileError` when `path.bak` is needed but unreadable.  Stale `.tmp` files are
    ignored.  `validate` defaults to `fastjson_loads`; `ConfigManager.load` passes its `decode`.
    """
    target = os.fspath(path)
    try:
        text = _read_nonempty_text(target)
        if text is not None:
            if validate is not None:
                validate(text)
            return text
    except Exception as exc:  # any read/decode failure falls back to .bak, like ConfigManager.load
        log.error("load %s failed (%s), trying the backup file %s.bak", target, exc, target)
    bak = target + ".bak"
    try:
        text = _read_nonempty_text(bak)
        if text is not None and validate is not None:
            validate(text)
    except Exception as exc:
        raise ConfigFileError(
            f"cannot load {target!r}: the main file and {bak!r} are unusable ({exc})"
        ) from exc
    if text is None:
        log.info("no usable content in %s or its backup; starting empty", target)
    return text


# ---------------------------------------------------------------------------------------------------
# managers
# ---------------------------------------------------------------------------------------------------


class ConfigManager(ABC):
    """Base of the config-file managers (RocketMQ's `ConfigManager`): `load()` reads the file (or its `.bak`),
    `persist()` writes `encode(True)` crash-safely, so broker state survives restarts.

    Subclasses implement `config_file_path`, `encode` and `decode`; `decode` must raise on bad content and
    replace the state only on success.  `self._lock` guards the state; `persist` also holds a separate
    lock for the write so that mutators never wait for an fsync and persists never reorder.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._persist_lock = threading.Lock()

    @abstractmethod
    def config_file_path(self) -> str:
        """Absolute path of the JSON file."""

    @abstractmethod
    def encode(self, pretty: bool = True) -> str:
        """The file content for the current state."""

    @abstractmethod
    def decode(self, text: str) -> None:
        """Load state from file content; raise `ConfigFileError` on bad content."""

    def load(self) -> bool:
        """Load the file, falling back to `.bak` (spec §13.1). False only if the backup is needed and bad."""
        path = self.config_file_path()
        with self._lock:
            try:
                read_config_file(path, validate=self.decode)
            except ConfigFileError as exc:
                log.error("load %s failed: %s", path, exc)
                return False
        return True

    def persist(self) -> None:
        """Write the current state to the file (old content kept in `.bak`)."""
        with self._persist_lock:
            with self._lock:
                text = self.encode(True)
            if text is not None:
                write_config_file(self.config_file_path(), text)


class _EntryTexts:
    """The entries of a config table (topics, groups) as the file writes them, each encoded once and kept while
    the table holds the same object (a change puts a new one), so writing the file after one change encodes
    that one entry, not the table (10,000 topics: 230 ms of encoding per topic created or deleted)."""

    LEVEL = 2  # an entry's nesting in the file: {"<table>": {"<name>": <entry>}}

    def __init__(self) -> None:
        self._texts: dict[tuple[str, bool], tuple[Any, Encoded]] = {}

    def table(self, table: dict[str, Any], pretty: bool) -> dict[str, Encoded]:
        """(under the manager's lock) name -> the entry's text."""
        texts = self._texts
        out: dict[str, Encoded] = {}
        for name, entry in table.items():
            hit = texts.get((name, pretty))
            if hit is None or hit[0] is not entry:  # the kept entry is referenced: its id is not reused
                hit = texts[(name, pretty)] = (entry, fastjson_encode_at(entry.to_bean(), self.LEVEL, pretty))
            out[name] = hit[1]
        if len(texts) > 2 * len(table) + 64:  # entries deleted since: forget their texts
            self._texts = {k: v for k, v in texts.items() if table.get(k[0]) is v[0]}
        return out


class TopicConfigManager(ConfigManager):
    """topics.json (`TopicConfigManager`): the topic table; every change bumps the data version and
    persists, so topic metadata survives restarts."""

    def __init__(self, config_dir: str | os.PathLike[str]) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.data_version = DataVersion()
        self._table: dict[str, TopicConfig] = {}
        self._texts = _EntryTexts()

    def config_file_path(self) -> str:
        """`<config_dir>/topics.json`."""
        return os.path.join(self.config_dir, TOPICS_FILE)

    def encode(self, pretty: bool = True) -> str:
        """`TopicConfigSerializeWrapper` JSON: `dataVersion`, `topicConfigTable`."""
        with self._lock:
            doc = Bean(
                dataVersion=self.data_version,
                topicConfigTable=self._texts.table(self._table, pretty),
            )
            return fastjson_dumps(doc, pretty)

    def decode(self, text: str) -> None:
        """Merge the file's topics into the table (Java `putAll`) and adopt its data version."""
        doc = as_object(fastjson_loads(text), TOPICS_FILE)
        table = {
            as_str(name, "topicConfigTable key"): TopicConfig.from_dict(value, name)
            for name, value in opt_object(doc, "topicConfigTable", TOPICS_FILE).items()
            if value is not None
        }
        version = DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else None
        with self._lock:
            self._table.update(table)
            if version is not None:
                self.data_version.assign_new_one(version)

    def get(self, topic: str) -> TopicConfig | None:
        """A copy of the topic's config, or None."""
        with self._lock:
            config = self._table.get(topic)
            return config.copy() if config is not None else None

    def __contains__(self, topic: object) -> bool:
        return topic in self._table

    def __len__(self) -> int:
        return len(self._table)

    def put(self, config: TopicConfig) -> TopicConfig | None:
        """Create or replace a topic (`updateTopicConfig`); returns the previous config. Persists."""
        validate_topic(config.topic_name)
        with self._lock:
            old = self._table.get(config.topic_name)
            self._table[config.topic_name] = config.copy()
            self.data_version.next_version()
        self.persist()
        return old

    update = put

    def delete(self, topic: str) -> TopicConfig | None:
        """Remove a topic (`deleteTopicConfig`); returns the removed config. Persists if it existed."""
        with self._lock:
            old = self._table.pop(topic, None)
            if old is None:
                return None
            self.data_version.next_version()
        self.persist()
        return old

    def list(self) -> list[TopicConfig]:
        """Copies of all topic configs, in table order."""
        with self._lock:
            return [config.copy() for config in self._table.values()]

    def topic_config_table(self) -> dict[str, TopicConfig]:
        """A copy of the whole table."""
        with self._lock:
            return {name: config.copy() for name, config in self._table.items()}


class ConsumerOffsetManager(ConfigManager):
    """consumerOffset.json (`ConsumerOffsetManager`): the next queue offset each group consumes, keyed
    `topic@group`; persisted explicitly (the broker calls `persist()` every 5 s and at shutdown)."""

    def __init__(self, config_dir: str | os.PathLike[str], update_version_step: int = 500) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.update_version_step = update_version_step
        self.data_version = DataVersion()
        self._offset_table: dict[str, dict[int, int]] = {}
        self._commits = 0
        # every change of the table but a commit (under the lock); `persist` writes only when it or `_commits`
        # moved: the native ACK lane (`_native.ack_one`) commits straight into the table and counts `_commits` only
        self._changes = 0
        self._persisted: tuple[int, int] | None = None  # (`_changes`, `_commits`) the file holds; None: not written

    def config_file_path(self) -> str:
        """`<config_dir>/consumerOffset.json`."""
        return os.path.join(self.config_dir, CONSUMER_OFFSET_FILE)

    def group_topic_map(self) -> dict[str, list[str]]:
        """group → topics with a committed offset (written as `groupTopicMap`, never read back)."""
        with self._lock:
            return self._group_topic_map(self._offset_table)

    @staticmethod
    def _group_topic_map(table: dict[str, dict[int, int]]) -> dict[str, list[str]]:
        result: dict[str, dict[str, None]] = {}
        for key in table:
            parts = key.split(TOPIC_GROUP_SEPARATOR)
            if len(parts) == 2:
                result.setdefault(parts[1], {})[parts[0]] = None
        return {group: list(topics) for group, topics in result.items()}

    def encode(self, pretty: bool = True) -> str:
        """`dataVersion`, `groupTopicMap`, `offsetTable` (integer queue ids as unquoted keys)."""
        with self._lock:
            table, version = self.offset_table(), self.data_version.copy()
        return self._encode(table, version, pretty)

    @staticmethod
    def _encode(table: dict[str, dict[int, int]], version: DataVersion, pretty: bool) -> str:
        doc = Bean(dataVersion=version, groupTopicMap=ConsumerOffsetManager._group_topic_map(table),
                   offsetTable=table)
        return fastjson_dumps(doc, pretty)

    def persist(self) -> None:
        """Write the file when an offset changed since the last write (the broker calls this every 5 s: an
        idle broker no longer rewrites a table of every group's queues each time). The table is copied
        under the lock and encoded outside it: a commit (one per POP) waits for the copy only."""
        with self._persist_lock:
            with self._lock:
                changes = (self._changes, self._commits)
                if changes == self._persisted:
                    return
                table, version = self.offset_table(), self.data_version.copy()
            write_config_file(self.config_file_path(), self._encode(table, version, True))
            self._persisted = changes

    def decode(self, text: str) -> None:
        """Replace the offset table (4.x: `offsetTable` only); `groupTopicMap` is ignored."""
        doc = as_object(fastjson_loads(text), CONSUMER_OFFSET_FILE)
        table = {
            as_str(key, "offsetTable key"): int_long_map(value, f"offsetTable[{key!r}]")
            for key, value in opt_object(doc, "offsetTable", CONSUMER_OFFSET_FILE).items()
            if value is not None
        }
        version = (
            DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else DataVersion()
        )
        with self._lock:
            self._offset_table = table
            self.data_version = version
            self._changes += 1

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record the next offset `group` will consume from `topic`/`queue_id` (not persisted here). The
        names are checked when the pair is new: a key of the table names one pair only (neither name may
        hold the separator), so a pair found there was checked when it was added (a POP commits per pop)."""
        key = topic + TOPIC_GROUP_SEPARATOR + group
        if key not in self._offset_table:
            validate_group(group)
            validate_topic(topic)
        with self._lock:
            offsets = self._offset_table.get(key)
            if offsets is None:
                offsets = self._offset_table[key] = {}
            previous = offsets.get(queue_id)
            offsets[queue_id] = offset
            if previous is not None and offset < previous:
                log.warning(
                    "[NOTIFYME] update consumer offset less than store: %s %d %d < %d",
                    key,
                    queue_id,
                    offset,
                    previous,
                )
            self._commits += 1
            if self.update_version_step > 0 and self._commits % self.update_version_step == 0:
                self.data_version.next_version()

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if the group never committed one for this queue."""
        offsets = self._offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group)
        if offsets is None:
            return -1
        offset = offsets.get(queue_id)
        return -1 if offset is None else offset

    def query_offsets(self, group: str, topic: str) -> dict[int, int]:
        """queue id → committed offset for one topic and group (a copy; empty if none)."""
        with self._lock:
            return dict(self._offset_table.get(topic + TOPIC_GROUP_SEPARATOR + group, {}))

    def offset_table(self) -> dict[str, dict[int, int]]:
        """A deep copy of the whole `topic@group` → {queueId: offset} table."""
        with self._lock:
            return {key: dict(offsets) for key, offsets in self._offset_table.items()}

    def remove_offset(self, group: str) -> None:
        """Forget every offset of `group` (`removeOffset`); the retry topic's offsets go too."""
        suffix = TOPIC_GROUP_SEPARATOR + group
        with self._lock:
            for key in [k for k in self._offset_table if k.endswith(suffix)]:
                del self._offset_table[key]
                self._changes += 1

    def clean_offset_by_topic(self, topic: str) -> int:
        """Forget every group's offsets in `topic` (`cleanOffsetByTopic`, a deleted topic); returns how many
        `topic@group` entries went (not persisted here)."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        with self._lock:
            keys = [k for k in self._offset_table if k.startswith(prefix) and TOPIC_GROUP_SEPARATOR not in k[len(prefix):]]
            for key in keys:
                del self._offset_table[key]
            if keys:
                self.data_version.next_version()
                self._changes += 1
        return len(keys)

    def which_topic_by_consumer(self, group: str) -> set[str]:
        """Topics `group` has offsets for (retry topic included)."""
        return set(self.group_topic_map().get(group, []))

    def which_group_by_topic(self, topic: str) -> set[str]:
        """Groups with offsets in `topic`."""
        prefix = topic + TOPIC_GROUP_SEPARATOR
        with self._lock:
            return {k[len(prefix) :] for k in self._offset_table if k.startswith(prefix)}


class SubscriptionGroupManager(ConfigManager):
    """subscriptionGroup.json (`SubscriptionGroupManager`): consumer group configs and the per-group
    forbidden-topic bits; every change bumps the data version and persists."""

    def __init__(self, config_dir: str | os.PathLike[str]) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.data_version = DataVersion()
        self._table: dict[str, SubscriptionGroupConfig] = {}
        self._forbidden: dict[str, dict[str, int]] = {}
        self._texts = _EntryTexts()

    def config_file_path(self) -> str:
        """`<config_dir>/subscriptionGroup.json`."""
        return os.path.join(self.config_dir, SUBSCRIPTION_GROUP_FILE)

    def encode(self, pretty: bool = True) -> str:
        """`dataVersion`, `forbiddenTable`, `subscriptionGroupTable`."""
        with self._lock:
            doc = Bean(
                dataVersion=self.data_version,
                forbiddenTable={group: dict(topics) for group, topics in self._forbidden.items()},
                subscriptionGroupTable=self._texts.table(self._table, pretty),
            )
            return fastjson_dumps(doc, pretty)

    def decode(self, text: str) -> None:
        """Merge the file's groups and forbidden bits into the tables and adopt its data version."""
        doc = as_object(fastjson_loads(text), SUBSCRIPTION_GROUP_FILE)
        table = {
            as_str(name, "subscriptionGroupTable key"): SubscriptionGroupConfig.from_dict(value, name)
            for name, value in opt_object(doc, "subscriptionGroupTable", SUBSCRIPTION_GROUP_FILE).items()
            if value is not None
        }
        forbidden: dict[str, dict[str, int]] = {}
        for group, topics in opt_object(doc, "forbiddenTable", SUBSCRIPTION_GROUP_FILE).items():
            if topics is None:
                continue
            what = f"forbiddenTable[{group!r}]"
            forbidden[as_str(group, "forbiddenTable key")] = {
                as_str(t, what): as_int(v, f"{what}[{t!r}]")
                for t, v in as_object(topics, what).items()
                if v is not None
            }
        version = DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else None
        with self._lock:
            self._table.update(table)
            self._forbidden.update(forbidden)
            if version is not None:
                self.data_version.assign_new_one(version)

    def get(self, group: str) -> SubscriptionGroupConfig | None:
        """A copy of the group's config, or None."""
        with self._lock:
            config = self._table.get(group)
            return config.copy() if config is not None else None

    def __contains__(self, group: object) -> bool:
        return group in self._table

    def __len__(self) -> int:
        return len(self._table)

    def put(self, config: SubscriptionGroupConfig) -> SubscriptionGroupConfig | None:
        """Create or replace a group (`updateSubscriptionGroupConfig`); returns the previous one. Persists."""
        validate_group(config.group_name)
        with self._lock:
            old = self._table.get(config.group_name)
            self._table[config.group_name] = config.copy()
            self.data_version.next_version()
        self.persist()
        return old

    update = put

    def delete(self, group: str) -> SubscriptionGroupConfig | None:
        """Remove a group and its forbidden bits; returns the removed config. Persists if it existed."""
        with self._lock:
            old = self._table.pop(group, None)
            self._forbidden.pop(group, None)
            if old is None:
                return None
            self.data_version.next_version()
        self.persist()
        return old

    def list(self) -> list[SubscriptionGroupConfig]:
        """Copies of all group configs, in table order."""
        with self._lock:
            return [config.copy() for config in self._table.values()]

    def get_forbidden(self, group: str, topic: str) -> int:
        """The forbidden bit mask of `group` on `topic` (0 if none)."""
        with self._lock:
            return self._forbidden.get(group, {}).get(topic, 0)

    def update_forbidden(self, group: str, topic: str, forbidden_index: int, set_or_clear: bool) -> None:
        """Set or clear bit `forbidden_index` of `group`'s mask on `topic` (`updateForbidden`). Persists."""
        with self._lock:
            value = self._forbidden.get(group, {}).get(topic, 0)
            value = value | (1 << forbidden_index) if set_or_clear else value & ~(1 << forbidden_index)
            topics = self._forbidden.setdefault(group, {})
            if value > 0:
                topics[topic] = value
            else:
                topics.pop(topic, None)
                if not topics:
                    del self._forbidden[group]
            self.data_version.next_version()
        self.persist()

    def forbidden_table(self) -> dict[str, dict[str, int]]:
        """A copy of group → topic → forbidden bit mask."""
        with self._lock:
            return {group: dict(topics) for group, topics in self._forbidden.items()}


class DelayOffsetManager(ConfigManager):
    """delayOffset.json (`ScheduleMessageService` offsets): per delay level (1-based), the next offset to
    deliver in `SCHEDULE_TOPIC_XXXX` queue `level - 1`; persisted explicitly (every 10 s and on stop)."""

    def __init__(self, config_dir: str | os.PathLike[str], update_version_step: int = 200) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.update_version_step = update_version_step
        self.data_version = DataVersion()
        self._offset_table: dict[int, int] = {}
        self._updates = 0

    def config_file_path(self) -> str:
        """`<config_dir>/delayOffset.json`."""
        return os.path.join(self.config_dir, DELAY_OFFSET_FILE)

    def encode(self, pretty: bool = True) -> str:
        """`DelayOffsetSerializeWrapper` JSON: `dataVersion`, `offsetTable` (level → offset, inline)."""
        with self._lock:
            return fastjson_dumps(
                Bean(dataVersion=self.data_version, offsetTable=dict(self._offset_table)), pretty
            )

    def decode(self, text: str) -> None:
        """Replace the offsets (4.x files have only `offsetTable`)."""
        doc = as_object(fastjson_loads(text), DELAY_OFFSET_FILE)
        table = int_long_map(doc.get("offsetTable"), "offsetTable")
        version = DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else None
        with self._lock:
            self._offset_table = table
            if version is not None:
                self.data_version.assign_new_one(version)

    def update_offset(self, delay_level: int, offset: int) -> None:
        """Set the next offset of a delay level (`updateOffset`); not persisted here."""
        with self._lock:
            self._offset_table[delay_level] = offset
            self._updates += 1
            if self.update_version_step > 0 and self._updates % self.update_version_step == 0:
                self.data_version.next_version()

    def query_offset(self, delay_level: int) -> int:
        """The stored offset of a delay level, or -1 if none (the caller starts from 0 then)."""
        offset = self._offset_table.get(delay_level)
        return -1 if offset is None else offset

    def offset_table(self) -> dict[int, int]:
        """A copy of level → offset."""
        with self._lock:
            return dict(self._offset_table)
