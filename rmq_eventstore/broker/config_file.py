"""`broker.conf`: broker and store settings the way RocketMQ takes them (`mqbroker -c broker.conf`): a Java
properties file with RocketMQ's camelCase names (`transactionTimeOut=1000`, `flushDiskType=SYNC_FLUSH`,
`storePathRootDir=/data/store`). Every `BrokerConfig` and `StoreConfig` field has its RocketMQ name; an
unknown name is refused with the list of known ones, a bad value with the name and what it should be.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from typing import Any

from ..store import StoreConfig
from .config import BrokerConfig

# RocketMQ spellings that plain camelCase does not give
_SPECIAL = {
    "transactionTimeOut": "transaction_timeout",
    "brokerIP1": "broker_ip1",
}
# RocketMQ settings of the server rather than of the broker object: the port, and the role (a single
# master; replication is not built, so a slave role is refused rather than silently run as a master)
SERVER_SETTINGS = {"listenPort": "listen_port", "brokerRole": "broker_role"}
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


class BrokerConfigFileError(ValueError):
    """A broker.conf that cannot be used; the message names the file, the line and what is wrong."""


def camel_case(snake: str) -> str:
    head, *rest = snake.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def known_names() -> dict[str, tuple[str, str]]:
    """RocketMQ name → (which config, our field name)."""
    names: dict[str, tuple[str, str]] = {}
    for kind, cls in (("store", StoreConfig), ("broker", BrokerConfig)):
        for f in dataclasses.fields(cls):
            names[camel_case(f.name)] = (kind, f.name)
    for rocketmq, field in _SPECIAL.items():
        kind = "broker" if field in BrokerConfig.field_names() else "store"
        names.pop(camel_case(field), None)
        names[rocketmq] = (kind, field)
    for rocketmq, field in SERVER_SETTINGS.items():
        names[rocketmq] = ("server", field)
    return names


def parse_properties(text: str) -> list[tuple[int, str, str]]:
    """(line number, key, value) of a Java properties text: `#`/`!` comments, `=` or `:` separators,
    blanks trimmed, backslash line continuations."""
    out = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i + 1
        line = lines[i].strip()
        while line.endswith("\\") and i + 1 < len(lines):
            i += 1
            line = line[:-1] + lines[i].strip()
        i += 1
        if not line or line[0] in "#!":
            continue
        m = re.match(r"([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if m is None:
            out.append((start, line, ""))
        else:
            out.append((start, m.group(1), m.group(2).strip()))
    return out


def _convert(value: str, current: Any, name: str) -> Any:
    if isinstance(current, bool):
        low = value.lower()
        if low in ("true", "false"):
            return low == "true"
        raise ValueError(f"{name} must be true or false, not {value!r}")
    if isinstance(current, int):
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name} must be an integer, not {value!r}") from None
    if isinstance(current, float):
        return float(value)
    if hasattr(current, "value") and hasattr(type(current), "__members__"):  # an Enum such as FlushDiskType
        try:
            return type(current)[value]
        except KeyError:
            raise ValueError(f"{name} must be one of {', '.join(type(current).__members__)}, not {value!r}") from None
    return value


def load_broker_conf(path: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(store settings, broker settings, server settings) from a RocketMQ broker.conf, by our names."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as e:
        raise BrokerConfigFileError(f"{path}: {e.strerror or e}") from None
    names = known_names()
    defaults = {"store": StoreConfig(), "broker": BrokerConfig()}
    out: dict[str, dict[str, Any]] = {"store": {}, "broker": {}, "server": {}}
    for line, key, value in parse_properties(text):
        if key not in names:
            close = difflib.get_close_matches(key, names, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise BrokerConfigFileError(
                f"{path}:{line}: unknown setting {key!r}{hint}. Known settings: {', '.join(sorted(names))}")
        kind, field = names[key]
        try:
            if kind == "server":
                out[kind][field] = _server_setting(key, value)
            else:
                out[kind][field] = _convert(value, getattr(defaults[kind], field), key)
        except ValueError as e:
            raise BrokerConfigFileError(f"{path}:{line}: {e}") from None
    return out["store"], out["broker"], out["server"]


def _server_setting(key: str, value: str) -> Any:
    if key == "listenPort":
        port = _convert(value, 0, key)
        if not 0 <= port <= 65535:
            raise ValueError(f"listenPort must be within 0..65535, not {port}")
        return port
    if value not in MASTER_ROLES:
        raise ValueError(f"brokerRole {value!r} is not served: this broker is a single master "
                         f"({' or '.join(MASTER_ROLES)}); replication to slaves is not built")
    return value
