"""System checks (``manage.py check``): ``rmq_eventstore.E001``… for settings that cannot work,
``W001``… for what may (an unreachable broker). Silence them with ``SILENCED_SYSTEM_CHECKS``."""

from __future__ import annotations

import os
from typing import Any

from django.core import checks

from .conf import SETTING, configured_aliases, setting_errors, store_settings

TAG = "rmq_eventstore"


@checks.register(TAG)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E001: malformed ``RMQ_EVENTSTORE``; E002: a local store path that cannot be created or written."""
    out: list[checks.CheckMessage] = []
    aliases = configured_aliases()
    if not aliases:
        out.append(checks.Error(f"{SETTING} is not set or empty",
                                hint=f"{SETTING} = {{'default': {{'URL': 'file:///path/to/store'}}}}",
                                id="rmq_eventstore.E001"))
        return out
    for alias, conf in aliases.items():
        for err in setting_errors(alias, conf):
            out.append(checks.Error(err, id="rmq_eventstore.E001"))
        if out:
            continue
        s = store_settings(alias)
        if s.kind == "file":
            problem = _path_problem(s.path or "")
            if problem:
                out.append(checks.Error(f"{SETTING}[{alias!r}]: store path {s.path} {problem}",
                                        hint="point URL at a directory this process may create and write",
                                        id="rmq_eventstore.E002"))
    return out


def _path_problem(path: str) -> str | None:
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return "has no existing ancestor"
        probe = parent
    if not os.path.isdir(probe):
        return f"cannot be created: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"is not writable ({probe} is not writable by this process)"
    return None
