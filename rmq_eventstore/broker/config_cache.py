"""Reads of a config file's entries (topics.json, subscriptionGroup.json), cached until the file's data
version moves: a send or pull looks its topic and group up without touching the file manager's lock."""

from __future__ import annotations

from typing import Any, Generic, Protocol, TypeVar

T = TypeVar("T")
CACHE_LIMIT = 100_000  # entries kept per cache; a hostile client naming millions of topics cannot grow it


class _Versioned(Protocol):
    data_version: Any


class ConfigCache(Generic[T]):
    """The entries read so far, dropped whenever the file's data version (counter, timestamp) moves."""

    def __init__(self, file: _Versioned) -> None:
        self.file = file
        self._entries: dict[str, T] = {}
        self._key: tuple[int, int] = (-1, -1)

    def entries(self) -> dict[str, T]:
        """The cache for the file as it is now (a fresh one after any change)."""
        dv = self.file.data_version
        key = (dv.counter, dv.timestamp)
        if key != self._key:
            self._entries = {}
            self._key = key
        return self._entries

    @staticmethod
    def remember(entries: dict[str, T], name: str, value: T) -> None:
        if len(entries) < CACHE_LIMIT:
            entries[name] = value
