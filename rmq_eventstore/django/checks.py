"""System checks (``manage.py check``): ``rmq_eventstore.E001``… for settings that cannot work,
``W001``… for what may (an unreachable broker, SQLite's deferred transactions). Silence them with
``SILENCED_SYSTEM_CHECKS``."""

from __future__ import annotations

import os
import socket
from typing import Any

from django.core import checks

from ..common.topic import validate_topic
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


@checks.register(TAG)
def check_brokers(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W001: a name server (``rmq://``) that does not accept a connection now."""
    out: list[checks.CheckMessage] = []
    for alias, conf in configured_aliases().items():
        if setting_errors(alias, conf):
            continue
        s = store_settings(alias)
        if s.kind != "rmq" or not s.namesrv:
            continue
        host, _, port = s.namesrv.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
        except OSError as e:
            out.append(checks.Warning(f"{SETTING}[{alias!r}]: the name server {s.namesrv} is unreachable ({e})",
                                      hint="start the broker (rmq-eventstore serve) or fix the URL",
                                      id="rmq_eventstore.W001"))
    return out


@checks.register(checks.Tags.database, TAG)
def check_sqlite_transaction_mode(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """W002: a SQLite database whose atomic blocks begin DEFERRED (Django's default). An append in a block that
    read first takes the write lock only at its first write; if another connection (the transaction watcher
    of this process, a worker's handlers) is committing then, SQLite answers "database is locked" at once,
    whatever the timeout, to avoid a deadlock. IMMEDIATE takes the lock at BEGIN and waits for it."""
    from django.conf import settings

    out: list[checks.CheckMessage] = []
    for alias, db in (getattr(settings, "DATABASES", None) or {}).items():
        if not str(db.get("ENGINE", "")).endswith("sqlite3"):
            continue
        mode = str((db.get("OPTIONS") or {}).get("transaction_mode") or "DEFERRED").upper()
        if mode == "DEFERRED":
            out.append(checks.Warning(
                f"DATABASES[{alias!r}] is SQLite with deferred transactions: an event appended in an atomic block "
                "that read first fails with 'database is locked' when another connection commits meanwhile",
                hint=f"DATABASES[{alias!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' (Django 5.1+)",
                id="rmq_eventstore.W002"))
    return out


@checks.register(checks.Tags.models, TAG)
def check_event_models(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """E003: an event model without a legal topic; E004: one naming a store alias that is not configured;
    E005: a codec that cannot be loaded."""
    from django.apps import apps

    from .models import EventModel, get_codec

    out: list[checks.CheckMessage] = []
    models = [m for m in apps.get_models() if issubclass(m, EventModel)]
    if app_configs is not None:
        models = [m for m in models if m._meta.app_config in app_configs]
    aliases = configured_aliases()
    for model in models:
        topic = getattr(model, "topic", None)
        if not isinstance(topic, str):
            out.append(checks.Error(f"{model.__name__} has no topic", hint='class OrderEvent(EventModel): topic = "orders"',
                                    obj=model, id="rmq_eventstore.E003"))
        else:
            try:
                validate_topic(topic)
            except ValueError as e:
                out.append(checks.Error(f"{model.__name__}.topic: {e}", obj=model, id="rmq_eventstore.E003"))
        if model.store_alias not in aliases:
            out.append(checks.Error(f"{model.__name__}.store_alias {model.store_alias!r} is not an alias of {SETTING}",
                                    obj=model, id="rmq_eventstore.E004"))
        spec = model.codec
        if spec is None and model.store_alias in aliases and not setting_errors(model.store_alias,
                                                                                 aliases[model.store_alias]):
            spec = store_settings(model.store_alias).options.get("CODEC", "json")
        if spec is not None:
            try:
                get_codec(spec)
            except Exception as e:
                out.append(checks.Error(f"{model.__name__}: the codec {spec!r} cannot be loaded: {e}", obj=model,
                                        id="rmq_eventstore.E005"))
    return out
