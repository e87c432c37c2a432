"""Subscription groups as the broker serves them, over the store's subscriptionGroup.json."""

from __future__ import annotations

from ..common.topic import is_valid_group
from ..common.topic_config import SubscriptionGroupConfig
from ..store.config_files import SubscriptionGroupManager as SubscriptionGroupFile
from .config import BrokerConfig

CACHE_LIMIT = 100_000  # configs kept per cache; a hostile client naming millions of groups cannot grow it


class SubscriptionGroupManager:
    """Subscription groups (`SubscriptionGroupManager`): cached reads, auto-creation when
    `auto_create_subscription_group`."""

    def __init__(self, file: SubscriptionGroupFile, config: BrokerConfig) -> None:
        self.file = file
        self.config = config
        self._cache: dict[str, SubscriptionGroupConfig] = {}
        self._key: tuple[int, int] = (-1, -1)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config (read-only: do not modify), cached until subscriptionGroup.json's data version
        moves; auto-created (and persisted) when `auto_create_subscription_group`."""
        dv = self.file.data_version
        key = (dv.counter, dv.timestamp)
        cache = self._cache
        if key != self._key:
            cache = self._cache = {}
            self._key = key
        cfg = cache.get(group)
        if cfg is not None:
            return cfg
        cfg = self.file.get(group)
        if cfg is None and self.config.auto_create_subscription_group and is_valid_group(group):
            cfg = SubscriptionGroupConfig(group)
            self.file.put(cfg)
        if cfg is not None and len(cache) < CACHE_LIMIT:
            cache[group] = cfg
        return cfg

    def put(self, cfg: SubscriptionGroupConfig) -> None:
        self.file.put(cfg)
