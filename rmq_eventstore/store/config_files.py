"""The broker's JSON config files under `<root>/config/` (spec §13), byte-compatible with RocketMQ 5.x.

* `fastjson_dumps` / `fastjson_loads`: the fastjson 1.2.83 pretty dialect RocketMQ writes (TAB indent,
  sorted bean fields, integer-keyed maps inline with unquoted keys) and a lenient reader for it (§13.2).
* `write_config_file` / `read_config_file`: crash-safe persistence with a `.bak` copy of the previous
  content, read back exactly like `ConfigManager.load` (main file, then `.bak`) (§13.1).
* `ConfigManager` and the four files: `TopicConfigManager` (topics.json), `ConsumerOffsetManager`
  (consumerOffset.json), `SubscriptionGroupManager` (subscriptionGroup.json) and `DelayOffsetManager`
  (delayOffset.json).  They read what 4.x and every 5.x write and write what 5.x writes.

Python representation used by the JSON writer:

* `Bean` (a `dict` subclass) is a Java bean: keys are written sorted, `None` values omitted.
* A plain `dict` is a Java map, written in its own (insertion) order; `str` keys one entry per line,
  `int` keys inline and unquoted (`{0:10,1:12` + newline + `}`).
* `list`, `tuple`, `set`, `frozenset` are written inline (`["a","b"]`), like fastjson's `CollectionCodec`.
* Objects with a `to_bean()` method (the dataclasses below) are written as that bean.
"""

from __future__ import annotations

import copy
import dataclasses
import enum
import json
import logging
import math
import os
import re
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from json.decoder import scanstring
from typing import Any

from rmq_eventstore.store.topic import validate_group, validate_topic

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


class ConfigFileError(ValueError):
    """A config file (or fastjson text) that cannot be parsed or decoded; the message says where and why."""


class Bean(dict):
    """A Java bean for `fastjson_dumps`: fields are written sorted by name and `None` fields are omitted.

    A plain `dict` is a Java *map* instead (insertion order kept, `int` keys written inline); the two
    differ only in how they are written, so a `Bean` compares equal to the `dict` it was read back as.
    """

    __slots__ = ()


# ---------------------------------------------------------------------------------------------------
# fastjson writer
# ---------------------------------------------------------------------------------------------------

_NEEDS_ESCAPE = re.compile(r'[\x00-\x1f"\\\x7f-\x9f]')
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _escape_char(m: re.Match[str]) -> str:
    ch = m.group()
    short = _SHORT_ESCAPES.get(ch)
    return short if short is not None else f"\\u{ord(ch):04X}"


def _quote(s: str) -> str:
    """A JSON string literal as fastjson writes it: raw UTF-8, control characters escaped."""
    if _NEEDS_ESCAPE.search(s) is None:
        return '"' + s + '"'
    return '"' + _NEEDS_ESCAPE.sub(_escape_char, s) + '"'


def _format_float(value: float) -> str:
    if not math.isfinite(value):
        return "null"  # fastjson writes NaN/Infinity as null
    return repr(value)


class _Writer:
    __slots__ = ("out", "pretty")

    def __init__(self, pretty: bool) -> None:
        self.out: list[str] = []
        self.pretty = pretty

    def newline(self, level: int) -> None:
        if self.pretty:
            self.out.append("\n" + "\t" * level)

    def value(self, obj: Any, level: int) -> None:
        out = self.out
        if obj is None:
            out.append("null")
        elif obj is True:
            out.append("true")
        elif obj is False:
            out.append("false")
        elif isinstance(obj, enum.Enum):
            out.append(_quote(obj.name))  # WriteEnumUsingName
        elif isinstance(obj, str):
            out.append(_quote(obj))
        elif isinstance(obj, int):
            out.append(str(int(obj)))
        elif isinstance(obj, float):
            out.append(_format_float(obj))
        elif isinstance(obj, Bean):
            self.bean(obj, level)
        elif isinstance(obj, Mapping):
            self.map(obj, level)
        elif isinstance(obj, (list, tuple, set, frozenset)):
            self.collection(obj, level)
        elif hasattr(obj, "to_bean"):
            self.value(obj.to_bean(), level)
        else:
            raise TypeError(f"fastjson_dumps cannot write {type(obj).__name__}: {obj!r}")

    def bean(self, obj: Mapping[str, Any], level: int) -> None:
        # JavaBeanSerializer: '{', newline at level+1 if the bean has fields, sorted fields, nulls skipped.
        out = self.out
        if not obj:
            out.append("{}")
            return
        inner = level + 1
        out.append("{")
        self.newline(inner)
        comma = False
        for key in sorted(obj):
            val = obj[key]
            if val is None:
                continue
            if comma:
                out.append(",")
                self.newline(inner)
            out.append(_quote(key) + ":")
            self.value(val, inner)
            comma = True
        self.newline(level)
        out.append("}")

    def map(self, obj: Mapping[Any, Any], level: int) -> None:
        # MapSerializer: String keys each on a new line; other keys inline as their JSON value.
        out = self.out
        inner = level + 1
        out.append("{")
        first = True
        for key, val in obj.items():
            if val is None:
                continue  # WriteMapNullValue is off
            if not first:
                out.append(",")
            if isinstance(key, str):
                self.newline(inner)
                out.append(_quote(key) + ":")
            elif isinstance(key, bool):
                out.append(("true" if key else "false") + ":")
            elif isinstance(key, int):
                out.append(str(int(key)) + ":")
            else:
                raise TypeError(
                    f"fastjson_dumps cannot write a map key of type {type(key).__name__}: {key!r}"
                )
            first = False
            self.value(val, inner)
        if len(obj) > 0:  # fastjson tests map.size(), null-valued entries included
            self.newline(level)
        out.append("}")

    def collection(self, obj: Iterable[Any], level: int) -> None:
        out = self.out
        out.append("[")
        for i, item in enumerate(obj):
            if i:
                out.append(",")
            self.value(item, level)
        out.append("]")


def fastjson_dumps(obj: Any, pretty: bool = True) -> str:
    """Serialize `obj` as fastjson 1.2.83 does with `PrettyFormat` (RocketMQ's `toJson(true)`), spec §13.2.

    TAB indentation, `\\n` newlines, no spaces, no trailing newline; `pretty=False` gives the compact form
    (`toJson(false)`).  See the module docstring for how beans, maps and collections are represented.
    """
    writer = _Writer(pretty)
    writer.value(obj, 0)
    return "".join(writer.out)


# ---------------------------------------------------------------------------------------------------
# lenient fastjson reader
# ---------------------------------------------------------------------------------------------------

_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_INT_KEY = re.compile(r"-?[0-9]+")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


class _Parser:
    __slots__ = ("text", "depth")

    MAX_DEPTH = 500

    def __init__(self, text: str) -> None:
        self.text = text
        self.depth = 0

    def error(self, msg: str, idx: int) -> ConfigFileError:
        line = self.text.count("\n", 0, idx) + 1
        col = idx - (self.text.rfind("\n", 0, idx) + 1) + 1
        snippet = self.text[idx : idx + 20]
        return ConfigFileError(f"invalid fastjson text: {msg} at line {line} column {col} (near {snippet!r})")

    def ws(self, idx: int) -> int:
        return _WS.match(self.text, idx).end()  # type: ignore[union-attr]

    def parse(self) -> Any:
        idx = self.ws(0)
        if idx >= len(self.text):
            raise self.error("empty document", idx)
        value, idx = self.value(idx)
        idx = self.ws(idx)
        if idx != len(self.text):
            raise self.error("unexpected data after the JSON value", idx)
        return value

    def string(self, idx: int) -> tuple[str, int]:
        try:
            return scanstring(self.text, idx + 1, True)
        except ValueError as exc:
            raise self.error(f"bad string ({exc})", idx) from None

    def value(self, idx: int) -> tuple[Any, int]:
        text = self.text
        if idx >= len(text):
            raise self.error("unexpected end of text", idx)
        ch = text[idx]
        if ch == "{":
            return self.obj(idx)
        if ch == "[":
            return self.array(idx)
        if ch == '"':
            return self.string(idx)
        if ch == "t" and text.startswith("true", idx):
            return True, idx + 4
        if ch == "f" and text.startswith("false", idx):
            return False, idx + 5
        if ch == "n" and text.startswith("null", idx):
            return None, idx + 4
        m = _NUMBER.match(text, idx)
        if m is not None:
            literal = m.group()
            try:
                if m.group(1) is None and m.group(2) is None:
                    return int(literal), m.end()
                return float(literal), m.end()
            except ValueError as exc:
                raise self.error(f"bad number ({exc})", idx) from None
        raise self.error("expected a JSON value", idx)

    def enter(self, idx: int) -> None:
        self.depth += 1
        if self.depth > self.MAX_DEPTH:
            raise self.error("nesting too deep", idx)

    def obj(self, idx: int) -> tuple[dict[Any, Any], int]:
        text = self.text
        self.enter(idx)
        result: dict[Any, Any] = {}
        idx = self.ws(idx + 1)
        if idx < len(text) and text[idx] == "}":
            self.depth -= 1
            return result, idx + 1
        while True:
            if idx >= len(text):
                raise self.error("unterminated object", idx)
            ch = text[idx]
            key: Any
            if ch == '"':
                key, idx = self.string(idx)
            else:
                m = _INT_KEY.match(text, idx)
                if m is None:
                    raise self.error("expected a quoted key or an integer key", idx)
                key, idx = int(m.group()), m.end()
            idx = self.ws(idx)
            if idx >= len(text) or text[idx] != ":":
                raise self.error("expected ':' after an object key", idx)
            val, idx = self.value(self.ws(idx + 1))
            result[key] = val
            idx = self.ws(idx)
            if idx < len(text) and text[idx] == ",":
                idx = self.ws(idx + 1)
                if idx < len(text) and text[idx] == "}":  # tolerate a trailing comma, as fastjson does
                    break
                continue
            if idx < len(text) and text[idx] == "}":
                break
            raise self.error("expected ',' or '}' in an object", idx)
        self.depth -= 1
        return result, idx + 1

    def array(self, idx: int) -> tuple[list[Any], int]:
        text = self.text
        self.enter(idx)
        result: list[Any] = []
        idx = self.ws(idx + 1)
        if idx < len(text) and text[idx] == "]":
            self.depth -= 1
            return result, idx + 1
        while True:
            val, idx = self.value(idx)
            result.append(val)
            idx = self.ws(idx)
            if idx < len(text) and text[idx] == ",":
                idx = self.ws(idx + 1)
                if idx < len(text) and text[idx] == "]":
                    break
                continue
            if idx < len(text) and text[idx] == "]":
                break
            raise self.error("expected ',' or ']' in an array", idx)
        self.depth -= 1
        return result, idx + 1


# Fast path for the fastjson dialect: outside string literals, an unquoted integer key can only appear
# as `{` or `,`, blanks, digits, blanks, `:`.  Such keys are rewritten to a marked string key
# ("\u0000I<digits>"), the C JSON parser does the work, and the marked keys become ints again.  The
# marker cannot collide with a real key because the rewrite is skipped when the text contains "\u0000".
_STRING_OR_INT_KEY = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|(?<=[{,])(\s*)(-?[0-9]+)(?=\s*:)', re.DOTALL)
_INT_KEY_MARK = "\x00I"


def _mark_int_key(m: re.Match[str]) -> str:
    digits = m.group(2)
    if digits is None:
        return m.group(0)
    return m.group(1) + '"\\u0000I' + digits + '"'


def _unmark_int_keys(pairs: list[tuple[str, Any]]) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key, value in pairs:
        if key.startswith(_INT_KEY_MARK):
            result[int(key[2:])] = value
        else:
            result[key] = value
    return result


def fastjson_loads(text: str | bytes) -> Any:
    """Parse fastjson/JSON text leniently: unquoted integer keys (`{0:10}`) become `int` keys, quoted keys
    stay `str` (so `"0"` is a string); a BOM and trailing commas are tolerated.

    Raises `ConfigFileError` (never another exception) on anything that is not such text.
    """
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigFileError(f"config text is not valid UTF-8: {exc}") from None
    if not isinstance(text, str):
        raise ConfigFileError(f"config text must be str or bytes, not {type(text).__name__}")
    if text.startswith("\ufeff"):
        text = text[1:]
    try:
        # Standard JSON (4.x files, string-keyed files) goes straight through the C parser.
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        pass
    if "\\u0000" not in text:
        try:
            marked = _STRING_OR_INT_KEY.sub(_mark_int_key, text)
            return json.loads(marked, object_pairs_hook=_unmark_int_keys, parse_constant=_reject_constant)
        except (ValueError, RecursionError):
            pass
    # Not (dialect) JSON, or a NUL escape: the exact parser decides and explains the error.
    return _parse_lenient(text)


def _parse_lenient(text: str) -> Any:
    try:
        return _Parser(text).parse()
    except RecursionError:
        raise ConfigFileError("invalid fastjson text: nesting too deep") from None


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
# value coercion for decoding (fastjson converts types leniently on the Java side)
# ---------------------------------------------------------------------------------------------------


def _as_int(value: Any, what: str) -> int:
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            pass
    raise ConfigFileError(f"{what}: expected an integer, got {value!r}")


def _as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigFileError(f"{what}: expected a boolean, got {value!r}")


def _as_str(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return fastjson_dumps(value)
    raise ConfigFileError(f"{what}: expected a string, got {value!r}")


def _as_object(value: Any, what: str) -> dict[Any, Any]:
    if isinstance(value, dict):
        return value
    raise ConfigFileError(f"{what}: expected a JSON object, got {type(value).__name__}")


def _opt_object(doc: Mapping[str, Any], key: str, what: str) -> dict[Any, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    return _as_object(value, f"{what}.{key}")


def _str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    return {_as_str(k, what): _as_str(v, what) for k, v in _as_object(value, what).items() if v is not None}


def _int_long_map(value: Any, what: str) -> dict[int, int]:
    """A Java Map<Integer, Long>: accepts unquoted and quoted integer keys."""
    if value is None:
        return {}
    return {
        _as_int(k, f"{what} key"): _as_int(v, f"{what}[{k!r}]")
        for k, v in _as_object(value, what).items()
        if v is not None
    }


def _to_beans(value: Any) -> Any:
    """Recursively mark string-keyed objects as beans (used for nested policy/subscription objects)."""
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return Bean((k, _to_beans(v)) for k, v in value.items())
        return {k: _to_beans(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_beans(v) for v in value]
    return value


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------------
# beans
# ---------------------------------------------------------------------------------------------------


@dataclass
class DataVersion:
    """RocketMQ's `DataVersion`: a (counter, stateVersion, timestamp) stamp bumped on every config change,
    which brokers and name servers compare to tell whether a config table changed."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = field(default_factory=_now_ms)

    def next_version(self, state_version: int = 0) -> None:
        """Bump the counter and set the timestamp to now (ms), as `DataVersion.nextVersion`."""
        self.timestamp = _now_ms()
        self.state_version = state_version
        self.counter += 1

    def assign_new_one(self, other: DataVersion) -> None:
        """Copy every field of `other` into this version (`DataVersion.assignNewOne`)."""
        self.counter = other.counter
        self.state_version = other.state_version
        self.timestamp = other.timestamp

    def copy(self) -> DataVersion:
        """An independent copy."""
        return dataclasses.replace(self)

    def to_bean(self) -> Bean:
        """The on-disk form: `{"counter","stateVersion","timestamp"}`."""
        return Bean(counter=self.counter, stateVersion=self.state_version, timestamp=self.timestamp)

    @classmethod
    def from_dict(cls, doc: Any) -> DataVersion:
        """Read a 4.x (`counter`, `timestamp`) or 5.x DataVersion object; missing fields get defaults."""
        obj = _as_object(doc, "dataVersion")
        version = cls()
        if obj.get("counter") is not None:
            version.counter = _as_int(obj["counter"], "dataVersion.counter")
        if obj.get("stateVersion") is not None:
            version.state_version = _as_int(obj["stateVersion"], "dataVersion.stateVersion")
        if obj.get("timestamp") is not None:
            version.timestamp = _as_int(obj["timestamp"], "dataVersion.timestamp")
        return version


class PermName:
    """Topic permission bits (`PermName`): a topic's `perm` is a combination of these (default 6 = RW)."""

    PERM_PRIORITY = 8
    PERM_READ = 4
    PERM_WRITE = 2
    PERM_INHERIT = 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        """True if the READ bit is set."""
        return perm & PermName.PERM_READ == PermName.PERM_READ

    @staticmethod
    def is_writeable(perm: int) -> bool:
        """True if the WRITE bit is set."""
        return perm & PermName.PERM_WRITE == PermName.PERM_WRITE


@dataclass
class TopicConfig:
    """One entry of topics.json (`TopicConfig`): queue counts, permissions and attributes of a topic."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PermName.PERM_READ | PermName.PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    def copy(self) -> TopicConfig:
        """An independent copy (attributes included)."""
        return dataclasses.replace(self, attributes=dict(self.attributes))

    def to_bean(self) -> Bean:
        """The on-disk form, camelCase fields."""
        return Bean(
            attributes=dict(self.attributes),
            order=self.order,
            perm=self.perm,
            readQueueNums=self.read_queue_nums,
            topicFilterType=self.topic_filter_type,
            topicName=self.topic_name,
            topicSysFlag=self.topic_sys_flag,
            writeQueueNums=self.write_queue_nums,
        )

    @classmethod
    def from_dict(cls, doc: Any, topic_name: str | None = None) -> TopicConfig:
        """Read a 4.x/5.x TopicConfig object; unknown fields are ignored, missing ones get defaults."""
        what = f"topicConfigTable[{topic_name!r}]"
        obj = _as_object(doc, what)
        name = obj.get("topicName")
        config = cls(
            topic_name=_as_str(name, what + ".topicName") if name is not None else (topic_name or "")
        )
        ints = {
            "readQueueNums": "read_queue_nums",
            "writeQueueNums": "write_queue_nums",
            "perm": "perm",
            "topicSysFlag": "topic_sys_flag",
        }
        for key, attr in ints.items():
            if obj.get(key) is not None:
                setattr(config, attr, _as_int(obj[key], f"{what}.{key}"))
        if obj.get("topicFilterType") is not None:
            config.topic_filter_type = _as_str(obj["topicFilterType"], what + ".topicFilterType")
        if obj.get("order") is not None:
            config.order = _as_bool(obj["order"], what + ".order")
        config.attributes = _str_map(obj.get("attributes"), what + ".attributes")
        return config


def _clone_json(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars); other objects are deep-copied as usual."""
    if isinstance(value, dict):
        return {k: _clone_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone_json(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


def _default_group_retry_policy() -> dict[str, Any]:
    return {"type": "CUSTOMIZED"}


@dataclass
class SubscriptionGroupConfig:
    """One entry of subscriptionGroup.json (`SubscriptionGroupConfig`): how a consumer group consumes and
    retries; defaults are RocketMQ's (spec §13.5)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    group_retry_policy: dict[str, Any] = field(default_factory=_default_group_retry_policy)
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    subscription_data_set: list[dict[str, Any]] | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    _BOOLS = {
        "consumeEnable": "consume_enable",
        "consumeFromMinEnable": "consume_from_min_enable",
        "consumeBroadcastEnable": "consume_broadcast_enable",
        "consumeMessageOrderly": "consume_message_orderly",
        "notifyConsumerIdsChangedEnable": "notify_consumer_ids_changed_enable",
    }
    _INTS = {
        "retryQueueNums": "retry_queue_nums",
        "retryMaxTimes": "retry_max_times",
        "brokerId": "broker_id",
        "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
        "groupSysFlag": "group_sys_flag",
        "consumeTimeoutMinute": "consume_timeout_minute",
    }

    def copy(self) -> SubscriptionGroupConfig:
        """An independent (deep) copy. The broker takes one on every pull, so the nested JSON-like fields
        are cloned directly instead of through `copy.deepcopy` (which cost ~15 µs per pull)."""
        c = copy.copy(self)
        c.group_retry_policy = _clone_json(self.group_retry_policy)
        c.subscription_data_set = _clone_json(self.subscription_data_set)
        c.attributes = dict(self.attributes)
        return c

    def to_bean(self) -> Bean:
        """The on-disk form, camelCase fields; `subscriptionDataSet` is omitted while None."""
        bean = Bean(groupName=self.group_name, attributes=dict(self.attributes))
        for key, attr in {**self._BOOLS, **self._INTS}.items():
            bean[key] = getattr(self, attr)
        bean["groupRetryPolicy"] = (
            _to_beans(self.group_retry_policy) if self.group_retry_policy is not None else None
        )
        bean["subscriptionDataSet"] = (
            _to_beans(list(self.subscription_data_set)) if self.subscription_data_set is not None else None
        )
        return bean

    @classmethod
    def from_dict(cls, doc: Any, group_name: str | None = None) -> SubscriptionGroupConfig:
        """Read a 4.x/5.x SubscriptionGroupConfig object; unknown fields are ignored."""
        what = f"subscriptionGroupTable[{group_name!r}]"
        obj = _as_object(doc, what)
        name = obj.get("groupName")
        config = cls(
            group_name=_as_str(name, what + ".groupName") if name is not None else (group_name or "")
        )
        for key, attr in cls._BOOLS.items():
            if obj.get(key) is not None:
                setattr(config, attr, _as_bool(obj[key], f"{what}.{key}"))
        for key, attr in cls._INTS.items():
            if obj.get(key) is not None:
                setattr(config, attr, _as_int(obj[key], f"{what}.{key}"))
        if obj.get("groupRetryPolicy") is not None:
            config.group_retry_policy = dict(_as_object(obj["groupRetryPolicy"], what + ".groupRetryPolicy"))
        if obj.get("subscriptionDataSet") is not None:
            items = obj["subscriptionDataSet"]
            if not isinstance(items, list):
                raise ConfigFileError(f"{what}.subscriptionDataSet: expected a list, got {items!r}")
            config.subscription_data_set = [dict(_as_object(i, what + ".subscriptionDataSet")) for i in items]
        config.attributes = _str_map(obj.get("attributes"), what + ".attributes")
        return config


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


class TopicConfigManager(ConfigManager):
    """topics.json (`TopicConfigManager`): the topic table; every change bumps the data version and
    persists, so topic metadata survives restarts."""

    def __init__(self, config_dir: str | os.PathLike[str]) -> None:
        super().__init__()
        self.config_dir = os.fspath(config_dir)
        self.data_version = DataVersion()
        self._table: dict[str, TopicConfig] = {}

    def config_file_path(self) -> str:
        """`<config_dir>/topics.json`."""
        return os.path.join(self.config_dir, TOPICS_FILE)

    def encode(self, pretty: bool = True) -> str:
        """`TopicConfigSerializeWrapper` JSON: `dataVersion`, `topicConfigTable`."""
        with self._lock:
            doc = Bean(
                dataVersion=self.data_version,
                topicConfigTable={name: config.to_bean() for name, config in self._table.items()},
            )
            return fastjson_dumps(doc, pretty)

    def decode(self, text: str) -> None:
        """Merge the file's topics into the table (Java `putAll`) and adopt its data version."""
        doc = _as_object(fastjson_loads(text), TOPICS_FILE)
        table = {
            _as_str(name, "topicConfigTable key"): TopicConfig.from_dict(value, name)
            for name, value in _opt_object(doc, "topicConfigTable", TOPICS_FILE).items()
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

    def config_file_path(self) -> str:
        """`<config_dir>/consumerOffset.json`."""
        return os.path.join(self.config_dir, CONSUMER_OFFSET_FILE)

    def group_topic_map(self) -> dict[str, list[str]]:
        """group → topics with a committed offset (written as `groupTopicMap`, never read back)."""
        result: dict[str, dict[str, None]] = {}
        with self._lock:
            for key in self._offset_table:
                parts = key.split(TOPIC_GROUP_SEPARATOR)
                if len(parts) == 2:
                    result.setdefault(parts[1], {})[parts[0]] = None
        return {group: list(topics) for group, topics in result.items()}

    def encode(self, pretty: bool = True) -> str:
        """`dataVersion`, `groupTopicMap`, `offsetTable` (integer queue ids as unquoted keys)."""
        with self._lock:
            doc = Bean(
                dataVersion=self.data_version,
                groupTopicMap=self.group_topic_map(),
                offsetTable={key: dict(offsets) for key, offsets in self._offset_table.items()},
            )
            return fastjson_dumps(doc, pretty)

    def decode(self, text: str) -> None:
        """Replace the offset table (4.x: `offsetTable` only); `groupTopicMap` is ignored."""
        doc = _as_object(fastjson_loads(text), CONSUMER_OFFSET_FILE)
        table = {
            _as_str(key, "offsetTable key"): _int_long_map(value, f"offsetTable[{key!r}]")
            for key, value in _opt_object(doc, "offsetTable", CONSUMER_OFFSET_FILE).items()
            if value is not None
        }
        version = (
            DataVersion.from_dict(doc["dataVersion"]) if doc.get("dataVersion") is not None else DataVersion()
        )
        with self._lock:
            self._offset_table = table
            self.data_version = version

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        """Record the next offset `group` will consume from `topic`/`queue_id` (not persisted here)."""
        validate_group(group)
        validate_topic(topic)
        key = topic + TOPIC_GROUP_SEPARATOR + group
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

    def config_file_path(self) -> str:
        """`<config_dir>/subscriptionGroup.json`."""
        return os.path.join(self.config_dir, SUBSCRIPTION_GROUP_FILE)

    def encode(self, pretty: bool = True) -> str:
        """`dataVersion`, `forbiddenTable`, `subscriptionGroupTable`."""
        with self._lock:
            doc = Bean(
                dataVersion=self.data_version,
                forbiddenTable={group: dict(topics) for group, topics in self._forbidden.items()},
                subscriptionGroupTable={name: config.to_bean() for name, config in self._table.items()},
            )
            return fastjson_dumps(doc, pretty)

    def decode(self, text: str) -> None:
        """Merge the file's groups and forbidden bits into the tables and adopt its data version."""
        doc = _as_object(fastjson_loads(text), SUBSCRIPTION_GROUP_FILE)
        table = {
            _as_str(name, "subscriptionGroupTable key"): SubscriptionGroupConfig.from_dict(value, name)
            for name, value in _opt_object(doc, "subscriptionGroupTable", SUBSCRIPTION_GROUP_FILE).items()
            if value is not None
        }
        forbidden: dict[str, dict[str, int]] = {}
        for group, topics in _opt_object(doc, "forbiddenTable", SUBSCRIPTION_GROUP_FILE).items():
            if topics is None:
                continue
            what = f"forbiddenTable[{group!r}]"
            forbidden[_as_str(group, "forbiddenTable key")] = {
                _as_str(t, what): _as_int(v, f"{what}[{t!r}]")
                for t, v in _as_object(topics, what).items()
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
        doc = _as_object(fastjson_loads(text), DELAY_OFFSET_FILE)
        table = _int_long_map(doc.get("offsetTable"), "offsetTable")
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
