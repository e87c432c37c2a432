"""The ``RMQ_EVENTSTORE`` setting: aliases of stores, shaped like ``DATABASES`` and ``CACHES``.

::

    RMQ_EVENTSTORE = {
        "default": {
            "URL": "file:///srv/app/var/store",   # a local store (or "rmq://host:9876": a name server)
            "OPTIONS": {
                "MODE": "shared",                 # file URLs: "shared" (one broker process per store,
                                                  # found or started) or "embedded" (a broker in this process)
                "PRODUCER_GROUP": "django",       # the transaction producer group (check-back answers)
                "DATABASE": "default",            # the database alias whose transactions bind appends
                "CODEC": "json",                  # "json", "raw" or a dotted path to a codec object
                "SEND_TIMEOUT_MS": 3000,
                "ACCESS_KEY": None, "SECRET_KEY": None,
                "BROKER": {},                     # StoreConfig/BrokerConfig fields for a broker we start
            },
        },
    }

`StoreSettings` is the parsed, validated form; `setting_errors` returns every problem at once for the
system checks, and `store_settings` raises `ImproperlyConfigured` on the first one when a store is used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

SETTING = "RMQ_EVENTSTORE"
DEFAULT_ALIAS = "default"
MODES = ("shared", "embedded")
KNOWN_OPTIONS = {
    "MODE": str, "PRODUCER_GROUP": str, "DATABASE": str, "CODEC": (str, object), "SEND_TIMEOUT_MS": int,
    "ACCESS_KEY": (str, type(None)), "SECRET_KEY": (str, type(None)), "BROKER": dict,
    "CHECK_GRACE_SECONDS": (int, float),
}
DEFAULT_OPTIONS: dict[str, Any] = {
    "MODE": "shared", "PRODUCER_GROUP": "django", "DATABASE": "default", "CODEC": "json",
    "SEND_TIMEOUT_MS": 3000, "ACCESS_KEY": None, "SECRET_KEY": None, "BROKER": {},
    "CHECK_GRACE_SECONDS": 30,
}


@dataclass(frozen=True)
class StoreSettings:
    """One alias of ``RMQ_EVENTSTORE``, parsed: ``kind`` is ``"file"`` (``path`` set) or ``"rmq"``
    (``namesrv`` set)."""

    alias: str
    url: str
    kind: str
    path: str | None = None
    namesrv: str | None = None
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def mode(self) -> str:
        return str(self.options["MODE"])


def configured_aliases() -> dict[str, Any]:
    value = getattr(settings, SETTING, None)
    if value is None:
        return {}
    return value if isinstance(value, dict) else {"?": value}


def _parse_url(url: str) -> tuple[str, str | None, str | None, str | None]:
    """(kind, path, namesrv, error)."""
    if not isinstance(url, str) or not url:
        return "", None, None, "URL must be a non-empty string such as 'file:///srv/app/var/store' or 'rmq://127.0.0.1:9876'"
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost"):
            return "", None, None, f"file URL {url!r} names a host; a local store is file:///absolute/path"
        path = unquote(parts.path)
        if not path or not os.path.isabs(path):
            return "", None, None, f"file URL {url!r} needs an absolute path (file:///srv/app/var/store)"
        return "file", os.path.normpath(path), None, None
    if parts.scheme in ("rmq", "rocketmq"):
        try:
            port = parts.port or 9876
        except ValueError:
            return "", None, None, f"URL {url!r} has an invalid port"
        if not parts.hostname:
            return "", None, None, f"URL {url!r} names no host; a name server is rmq://host:9876"
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return "rmq", None, f"{host}:{port}", None
    return "", None, None, (f"URL {url!r} has scheme {parts.scheme!r}; use file:///path/to/store for a local store "
                            "or rmq://host:9876 for a name server")


def setting_errors(alias: str, conf: Any) -> list[str]:
    """Every problem of one alias's configuration (empty when it is usable)."""
    if not isinstance(conf, dict):
        return [f"{SETTING}[{alias!r}] must be a dict with a 'URL', not {type(conf).__name__}"]
    errors: list[str] = []
    unknown = set(conf) - {"URL", "OPTIONS"}
    if unknown:
        errors.append(f"{SETTING}[{alias!r}] has unknown keys {sorted(unknown)}; known: URL, OPTIONS")
    if "URL" not in conf:
        errors.append(f"{SETTING}[{alias!r}] has no 'URL'")
    else:
        _, _, _, err = _parse_url(conf["URL"])
        if err:
            errors.append(f"{SETTING}[{alias!r}]: {err}")
    options = conf.get("OPTIONS", {})
    if not isinstance(options, dict):
        errors.append(f"{SETTING}[{alias!r}]['OPTIONS'] must be a dict")
        return errors
    for name, value in options.items():
        if name not in KNOWN_OPTIONS:
            errors.append(f"{SETTING}[{alias!r}]['OPTIONS'] has unknown option {name!r}; known: "
                          f"{', '.join(sorted(KNOWN_OPTIONS))}")
        elif not isinstance(value, KNOWN_OPTIONS[name]):  # type: ignore[arg-type]
            errors.append(f"{SETTING}[{alias!r}]['OPTIONS'][{name!r}] has the wrong type {type(value).__name__}")
    mode = options.get("MODE", DEFAULT_OPTIONS["MODE"])
    if mode not in MODES:
        errors.append(f"{SETTING}[{alias!r}]['OPTIONS']['MODE'] is {mode!r}; one of {', '.join(MODES)}")
    timeout = options.get("SEND_TIMEOUT_MS", 1)
    if isinstance(timeout, int) and timeout <= 0:
        errors.append(f"{SETTING}[{alias!r}]['OPTIONS']['SEND_TIMEOUT_MS'] must be positive")
    return errors


def store_settings(alias: str = DEFAULT_ALIAS) -> StoreSettings:
    """The parsed settings of `alias`; `ImproperlyConfigured` with every problem if they are not usable."""
    aliases = configured_aliases()
    if alias not in aliases:
        known = ", ".join(repr(a) for a in aliases) or "none"
        raise ImproperlyConfigured(f"{SETTING} has no store alias {alias!r} (configured: {known}); "
                                   f"add {SETTING} = {{{alias!r}: {{'URL': 'file:///path/to/store'}}}} to settings")
    conf = aliases[alias]
    errors = setting_errors(alias, conf)
    if errors:
        raise ImproperlyConfigured("; ".join(errors))
    kind, path, namesrv, _ = _parse_url(conf["URL"])
    options = {**DEFAULT_OPTIONS, **conf.get("OPTIONS", {})}
    return StoreSettings(alias, conf["URL"], kind, path, namesrv, options)
