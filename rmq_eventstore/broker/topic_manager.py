"""Topics as the broker serves them, over the store's topics.json: read through a cache keyed by the file's
data version, created on first use where RocketMQ creates them (auto-created, retry and DLQ topics)."""

from __future__ import annotations

import logging
import threading

from ..common.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    TopicValidationError,
    is_not_allowed_send_topic,
    is_system_topic,
    validate_topic,
)
from ..common.topic_config import PermName, TopicConfig
from ..store.config_files import TopicConfigManager as TopicConfigFile
from .config import BrokerConfig
from .config_cache import ConfigCache
from .subscription_group_manager import SubscriptionGroupManager

log = logging.getLogger(__name__)
ABSENT: TopicConfig = TopicConfig("%ABSENT%")  # cached for a name topics.json does not hold (the native ACK lane compares it)


class TopicManager:
    """Topic configs (`TopicConfigManager`): cached reads, creation of auto, retry and DLQ topics."""

    def __init__(self, file: TopicConfigFile, groups: SubscriptionGroupManager, config: BrokerConfig) -> None:
        self.file = file
        self.groups = groups
        self.config = config
        self._lock = threading.Lock()
        self._cache: ConfigCache[TopicConfig] = ConfigCache(file)

    def get(self, topic: str) -> TopicConfig | None:
        """The topic's config (read-only: do not modify), cached until topics.json's data version moves (a
        topic that does not exist too: every creation moves the version; a POP asks for its retry topic)."""
        cache = self._cache.entries()
        tc = cache.get(topic)
        if tc is None:
            tc = self.file.get(topic)
            ConfigCache.remember(cache, topic, tc if tc is not None else ABSENT)
            return tc
        return None if tc is ABSENT else tc

    def ensure(self, topic: str, queue_nums: int, perm: int = PermName.PERM_READ | PermName.PERM_WRITE,
               topic_sys_flag: int = 0) -> TopicConfig:
        """The topic's config, created with `queue_nums` queues when it does not exist."""
        tc = self.file.get(topic)
        if tc is not None:
            return tc
        with self._lock:
            tc = self.file.get(topic)
            if tc is None:
                tc = TopicConfig(topic, queue_nums, queue_nums, perm, topic_sys_flag=topic_sys_flag)
                self.file.put(tc)
                log.info("created topic %s with %d queues", topic, queue_nums)
        return tc

    def create_retry_topic(self, group: str) -> TopicConfig | None:
        sg = self.groups.find(group)
        if sg is None or sg.retry_queue_nums <= 0:
            return None
        return self.ensure(RETRY_GROUP_TOPIC_PREFIX + group, sg.retry_queue_nums)

    def create(self, topic: str, read_queue_nums: int = 4, write_queue_nums: int = 4,
               perm: int = PermName.PERM_READ | PermName.PERM_WRITE, order: bool = False) -> TopicConfig:
        """Create or update a topic (`UPDATE_AND_CREATE_TOPIC`); system topics are refused."""
        validate_topic(topic)
        if is_system_topic(topic):
            raise TopicValidationError(f"The topic[{topic}] is conflict with system topic.")
        if not (0 < read_queue_nums <= 1024 and 0 < write_queue_nums <= 1024):
            raise ValueError("queue numbers must be within 1..1024")
        old = self.file.get(topic)
        tc = old.copy() if old is not None else TopicConfig(topic)
        tc.read_queue_nums, tc.write_queue_nums, tc.perm, tc.order = read_queue_nums, write_queue_nums, perm, order
        self.file.put(tc)
        return tc

    def auto_topic(self, topic: str) -> TopicConfig | None:
        """The config the first send will create for an unknown topic (not persisted), or None when
        topics are not auto-created or the name is not one a client may create."""
        if (not self.config.auto_create_topic_enable or is_not_allowed_send_topic(topic) or is_system_topic(topic)
                or topic.startswith(RETRY_GROUP_TOPIC_PREFIX) or topic.startswith(DLQ_GROUP_TOPIC_PREFIX)):
            return None
        try:
            validate_topic(topic)
        except (TopicValidationError, TypeError):
            return None
        n = self.config.default_topic_queue_nums
        return TopicConfig(topic, n, n)

    def routable(self, topic: str) -> TopicConfig | None:
        """The config a route lookup answers with: the topic's, its group's retry topic, or the one an
        auto-created topic will get; None when the topic is unknown and may not be created."""
        tc = self.get(topic)
        if tc is not None:
            return tc
        if topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
            rest = topic[len(RETRY_GROUP_TOPIC_PREFIX):]
            # The name of a pop retry topic, `%RETRY%<group>_<topic>` of an existing group, is not created by a
            # route lookup (it exists once the revive puts a message back): taken for a group's retry topic it
            # would create a subscription group `<group>_<topic>` for every such lookup (a kombu queue deleted
            # with its pop retry topic, 10,000 times).
            if any(c == "_" and self.groups.file.get(rest[:i]) is not None for i, c in enumerate(rest)):
                return None
            return self.create_retry_topic(rest)
        return self.auto_topic(topic)
