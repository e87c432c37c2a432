"""`<store>/broker.json`: how the broker that owns a store announces itself to other processes.

A store has one owner process (its `lock` file); a process that wants the store finds the owner's broker
here and talks to it over loopback. The broker writes the file once it serves (write a temporary file,
fsync, rename, fsync the directory, so a reader sees the old file or the whole new one) and removes it on
a clean shutdown if it is still its own. The format, version 1::

    {"version": 1, "pid": 1234, "namesrv": "127.0.0.1:40123", "broker": "127.0.0.1:40124",
     "started_ms": 1764065768850}

Both the broker (writer) and the client (`rmq_eventstore.client.local`, reader) use this module, which is
why it lives in `common`.
"""

from __future__ import annotations

import json
import os
from typing import Any

BROKER_FILE = "broker.json"
BROKER_FILE_VERSION = 1


def broker_file_path(store_path: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(store_path), BROKER_FILE)


def write_broker_file(store_path: str | os.PathLike[str], *, pid: int, namesrv: str, broker: str,
                      started_ms: int) -> None:
    """Write the announcement atomically (temp + fsync + rename + directory fsync)."""
    root = os.fspath(store_path)
    data = {"version": BROKER_FILE_VERSION, "pid": pid, "namesrv": namesrv, "broker": broker,
            "started_ms": started_ms}
    tmp = os.path.join(root, f".{BROKER_FILE}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            os.write(fd, (json.dumps(data) + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, broker_file_path(root))
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(root, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def read_broker_file(store_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The announcement, or None when there is none or it is not a usable version-1 file."""
    try:
        with open(broker_file_path(store_path), "rb") as f:
            data = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("version") != BROKER_FILE_VERSION:
        return None
    if not isinstance(data.get("pid"), int) or not isinstance(data.get("namesrv"), str) \
            or not isinstance(data.get("broker"), str):
        return None
    return data


def remove_broker_file_if_ours(store_path: str | os.PathLike[str], pid: int, namesrv: str) -> bool:
    """Remove the announcement if it is the one of (`pid`, `namesrv`); True when removed."""
    data = read_broker_file(store_path)
    if data is None or data.get("pid") != pid or data.get("namesrv") != namesrv:
        return False
    try:
        os.unlink(broker_file_path(store_path))
    except FileNotFoundError:
        return False
    return True
