"""Subscription groups as the broker serves them, over the store's subscriptionGroup.json."""

from __future__ import annotations

from ..common.topic import is_valid_group
from ..common.topic_config import SubscriptionGroupConfig
from ..store.config_files import SubscriptionGroupManager as SubscriptionGroupFile
from .config import BrokerConfig
from .config_cache import ConfigCache


class SubscriptionGroupManager:
    """Subscription groups (`SubscriptionGroupManager`): cached reads, auto-creation when
    `auto_create_subscription_group`."""

    def __init__(self, file: SubscriptionGroupFile, config: BrokerConfig) -> None:
        self.file = file
        self.config = config
        self._cache: ConfigCache[SubscriptionGroupConfig] = ConfigCache(file)

    def find(self, group: str) -> SubscriptionGroupConfig | None:
        """The group's config (read-only: do not modify), cached until subscriptionGroup.json's data version
        moves; auto-created (and persisted) when `auto_create_subscription_group`."""
        cache = self._cache.entries()
        cfg = cache.get(group)
        if cfg is not None:
            return cfg
        cfg = self.file.get(group)
        if cfg is None and self.config.auto_create_subscription_group and is_valid_group(group):
            cfg = SubscriptionGroupConfig(group)
            self.file.put(cfg)
        if cfg is not None:
            ConfigCache.remember(cache, group, cfg)
        return cfg

    def put(self, cfg: SubscriptionGroupConfig) -> None:
        self.file.put(cfg)
