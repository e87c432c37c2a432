"""The fastjson 1.2.83 dialect RocketMQ writes its config files and request bodies in (spec §13.2): a
writer (TAB indent, sorted bean fields, integer-keyed maps inline with unquoted keys) and a lenient reader,
plus the lenient value coercions fastjson applies on the Java side.

* `Bean` (a `dict` subclass) is a Java bean: keys are written sorted, `None` values omitted.
* A plain `dict` is a Java map, written in its own (insertion) order; `str` keys one entry per line,
  `int` keys inline and unquoted (`{0:10,1:12` + newline + `}`).
* `list`, `tuple`, `set`, `frozenset` are written inline (`["a","b"]`), like fastjson's `CollectionCodec`.
* Objects with a `to_bean()` method are written as that bean.
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Iterable, Mapping
from json.decoder import scanstring
from typing import Any


class ConfigFileError(ValueError):
    """A config file (or fastjson text) that cannot be parsed or decoded; the message says where and why."""


class ObjectKey(tuple):
    """A map key that is a Java object, as fastjson writes `Map<MessageQueue, ...>`: the object inline as the
    key (`{{"brokerName":"b","queueId":0,"topic":"t"}:{...}}`). Hashable: the bean's (field, value) pairs
    sorted by field; `as_dict()` gives the object back. `fastjson_dumps` writes it inline as that bean."""

    __slots__ = ()

    @classmethod
    def of(cls, fields: Mapping[str, Any]) -> ObjectKey:
        return cls(sorted(fields.items()))

    def as_dict(self) -> dict[str, Any]:
        return dict(self)


class Bean(dict):
    """A Java bean for `fastjson_dumps`: fields are written sorted by name and `None` fields are omitted.

    A plain `dict` is a Java *map* instead (insertion order kept, `int` keys written inline); the two
    differ only in how they are written, so a `Bean` compares equal to the `dict` it was read back as.
    """

    __slots__ = ()


class Encoded(str):
    """Text already in the fastjson dialect, written as it is: a value encoded once by `fastjson_encode_at`
    at the nesting level it is written at, and kept (a config file's entries: see `store.config_files`)."""

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
        if obj.__class__ is Encoded:
            out.append(obj)
        elif obj is None:
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
            elif isinstance(key, ObjectKey):
                self.bean(Bean(key.as_dict()), inner)
                out.append(":")
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


def fastjson_encode_at(obj: Any, level: int, pretty: bool = True) -> Encoded:
    """`obj` as `fastjson_dumps` writes it nested `level` deep (its indentation), to be written as it is."""
    writer = _Writer(pretty)
    writer.value(obj, level)
    return Encoded("".join(writer.out))


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
            elif ch == "{":  # an object as the key (fastjson's Map<MessageQueue, ...>)
                obj, idx = self.obj(idx)
                try:
                    key = ObjectKey.of(obj)
                    hash(key)
                except TypeError:
                    raise self.error("an object key must hold plain values", idx) from None
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
# value coercion for decoding (fastjson converts types leniently on the Java side)
# ---------------------------------------------------------------------------------------------------


def as_int(value: Any, what: str) -> int:
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


def as_bool(value: Any, what: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return value != 0
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise ConfigFileError(f"{what}: expected a boolean, got {value!r}")


def as_str(value: Any, what: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (bool, int, float)):
        return fastjson_dumps(value)
    raise ConfigFileError(f"{what}: expected a string, got {value!r}")


def as_object(value: Any, what: str) -> dict[Any, Any]:
    if isinstance(value, dict):
        return value
    raise ConfigFileError(f"{what}: expected a JSON object, got {type(value).__name__}")


def opt_object(doc: Mapping[str, Any], key: str, what: str) -> dict[Any, Any]:
    value = doc.get(key)
    if value is None:
        return {}
    return as_object(value, f"{what}.{key}")


def str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    return {as_str(k, what): as_str(v, what) for k, v in as_object(value, what).items() if v is not None}


def int_long_map(value: Any, what: str) -> dict[int, int]:
    """A Java Map<Integer, Long>: accepts unquoted and quoted integer keys."""
    if value is None:
        return {}
    return {
        as_int(k, f"{what} key"): as_int(v, f"{what}[{k!r}]")
        for k, v in as_object(value, what).items()
        if v is not None
    }


def to_beans(value: Any) -> Any:
    """Recursively mark string-keyed objects as beans (used for nested policy/subscription objects)."""
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value):
            return Bean((k, to_beans(v)) for k, v in value.items())
        return {k: to_beans(v) for k, v in value.items()}
    if isinstance(value, list):
        return [to_beans(v) for v in value]
    return value
