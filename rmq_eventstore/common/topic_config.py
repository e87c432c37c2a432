"""Topic and subscription-group configs as RocketMQ keeps them (`TopicConfig`, `SubscriptionGroupConfig`,
`PermName`, `DataVersion`): the beans of topics.json and subscriptionGroup.json, also sent in route and
admin bodies, so broker, client and tools share them."""

from __future__ import annotations

import copy
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from .fastjson import (
    Bean,
    ConfigFileError,
    as_bool,
    as_int,
    as_object,
    as_str,
    str_map,
    to_beans,
)


def _now_ms() -> int:
    return int(time.time() * 1000)




@dataclass
class DataVersion:
    """RocketMQ's `DataVersion`: a (counter, stateVersion, timestamp) stamp bumped on every config change,
    which brokers and name servers compare to tell whether a config table changed."""

    counter: int = 0
    state_version: int = 0
    timestamp: int = field(default_factory=_now_ms)

    def next_version(self, state_version: int = 0) -> None:
        """Bump the counter and set the timestamp to now (ms), as `DataVersion.nextVersion`."""
        self.timestamp = _now_ms()
        self.state_version = state_version
        self.counter += 1

    def assign_new_one(self, other: DataVersion) -> None:
        """Copy every field of `other` into this version (`DataVersion.assignNewOne`)."""
        self.counter = other.counter
        self.state_version = other.state_version
        self.timestamp = other.timestamp

    def copy(self) -> DataVersion:
        """An independent copy."""
        return dataclasses.replace(self)

    def to_bean(self) -> Bean:
        """The on-disk form: `{"counter","stateVersion","timestamp"}`."""
        return Bean(counter=self.counter, stateVersion=self.state_version, timestamp=self.timestamp)

    @classmethod
    def from_dict(cls, doc: Any) -> DataVersion:
        """Read a 4.x (`counter`, `timestamp`) or 5.x DataVersion object; missing fields get defaults."""
        obj = as_object(doc, "dataVersion")
        version = cls()
        if obj.get("counter") is not None:
            version.counter = as_int(obj["counter"], "dataVersion.counter")
        if obj.get("stateVersion") is not None:
            version.state_version = as_int(obj["stateVersion"], "dataVersion.stateVersion")
        if obj.get("timestamp") is not None:
            version.timestamp = as_int(obj["timestamp"], "dataVersion.timestamp")
        return version


class PermName:
    """Topic permission bits (`PermName`): a topic's `perm` is a combination of these (default 6 = RW)."""

    PERM_PRIORITY = 8
    PERM_READ = 4
    PERM_WRITE = 2
    PERM_INHERIT = 1

    @staticmethod
    def is_readable(perm: int) -> bool:
        """True if the READ bit is set."""
        return perm & PermName.PERM_READ == PermName.PERM_READ

    @staticmethod
    def is_writeable(perm: int) -> bool:
        """True if the WRITE bit is set."""
        return perm & PermName.PERM_WRITE == PermName.PERM_WRITE


@dataclass
class TopicConfig:
    """One entry of topics.json (`TopicConfig`): queue counts, permissions and attributes of a topic."""

    topic_name: str
    read_queue_nums: int = 16
    write_queue_nums: int = 16
    perm: int = PermName.PERM_READ | PermName.PERM_WRITE
    topic_filter_type: str = "SINGLE_TAG"
    topic_sys_flag: int = 0
    order: bool = False
    attributes: dict[str, str] = field(default_factory=dict)

    def copy(self) -> TopicConfig:
        """An independent copy (attributes included)."""
        return dataclasses.replace(self, attributes=dict(self.attributes))

    def to_bean(self) -> Bean:
        """The on-disk form, camelCase fields."""
        return Bean(
            attributes=dict(self.attributes),
            order=self.order,
            perm=self.perm,
            readQueueNums=self.read_queue_nums,
            topicFilterType=self.topic_filter_type,
            topicName=self.topic_name,
            topicSysFlag=self.topic_sys_flag,
            writeQueueNums=self.write_queue_nums,
        )

    @classmethod
    def from_dict(cls, doc: Any, topic_name: str | None = None) -> TopicConfig:
        """Read a 4.x/5.x TopicConfig object; unknown fields are ignored, missing ones get defaults."""
        what = f"topicConfigTable[{topic_name!r}]"
        obj = as_object(doc, what)
        name = obj.get("topicName")
        config = cls(
            topic_name=as_str(name, what + ".topicName") if name is not None else (topic_name or "")
        )
        ints = {
            "readQueueNums": "read_queue_nums",
            "writeQueueNums": "write_queue_nums",
            "perm": "perm",
            "topicSysFlag": "topic_sys_flag",
        }
        for key, attr in ints.items():
            if obj.get(key) is not None:
                setattr(config, attr, as_int(obj[key], f"{what}.{key}"))
        if obj.get("topicFilterType") is not None:
            config.topic_filter_type = as_str(obj["topicFilterType"], what + ".topicFilterType")
        if obj.get("order") is not None:
            config.order = as_bool(obj["order"], what + ".order")
        config.attributes = str_map(obj.get("attributes"), what + ".attributes")
        return config


def _clone_json(value: Any) -> Any:
    """A deep copy of JSON-like data (dicts, lists, scalars); other objects are deep-copied as usual."""
    if isinstance(value, dict):
        return {k: _clone_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_clone_json(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return copy.deepcopy(value)


def _default_group_retry_policy() -> dict[str, Any]:
    return {"type": "CUSTOMIZED"}


@dataclass
class SubscriptionGroupConfig:
    """One entry of subscriptionGroup.json (`SubscriptionGroupConfig`): how a consumer group consumes and
    retries; defaults are RocketMQ's (spec §13.5)."""

    group_name: str
    consume_enable: bool = True
    consume_from_min_enable: bool = True
    consume_broadcast_enable: bool = True
    consume_message_orderly: bool = False
    retry_queue_nums: int = 1
    retry_max_times: int = 16
    group_retry_policy: dict[str, Any] = field(default_factory=_default_group_retry_policy)
    broker_id: int = 0
    which_broker_when_consume_slowly: int = 1
    notify_consumer_ids_changed_enable: bool = True
    group_sys_flag: int = 0
    consume_timeout_minute: int = 15
    subscription_data_set: list[dict[str, Any]] | None = None
    attributes: dict[str, str] = field(default_factory=dict)

    _BOOLS = {
        "consumeEnable": "consume_enable",
        "consumeFromMinEnable": "consume_from_min_enable",
        "consumeBroadcastEnable": "consume_broadcast_enable",
        "consumeMessageOrderly": "consume_message_orderly",
        "notifyConsumerIdsChangedEnable": "notify_consumer_ids_changed_enable",
    }
    _INTS = {
        "retryQueueNums": "retry_queue_nums",
        "retryMaxTimes": "retry_max_times",
        "brokerId": "broker_id",
        "whichBrokerWhenConsumeSlowly": "which_broker_when_consume_slowly",
        "groupSysFlag": "group_sys_flag",
        "consumeTimeoutMinute": "consume_timeout_minute",
    }

    def copy(self) -> SubscriptionGroupConfig:
        """An independent (deep) copy. The broker takes one on every pull, so the nested JSON-like fields
        are cloned directly instead of through `copy.deepcopy` (which cost ~15 µs per pull)."""
        c = copy.copy(self)
        c.group_retry_policy = _clone_json(self.group_retry_policy)
        c.subscription_data_set = _clone_json(self.subscription_data_set)
        c.attributes = dict(self.attributes)
        return c

    def to_bean(self) -> Bean:
        """The on-disk form, camelCase fields; `subscriptionDataSet` is omitted while None."""
        bean = Bean(groupName=self.group_name, attributes=dict(self.attributes))
        for key, attr in {**self._BOOLS, **self._INTS}.items():
            bean[key] = getattr(self, attr)
        bean["groupRetryPolicy"] = (
            to_beans(self.group_retry_policy) if self.group_retry_policy is not None else None
        )
        bean["subscriptionDataSet"] = (
            to_beans(list(self.subscription_data_set)) if self.subscription_data_set is not None else None
        )
        return bean

    @classmethod
    def from_dict(cls, doc: Any, group_name: str | None = None) -> SubscriptionGroupConfig:
        """Read a 4.x/5.x SubscriptionGroupConfig object; unknown fields are ignored."""
        what = f"subscriptionGroupTable[{group_name!r}]"
        obj = as_object(doc, what)
        name = obj.get("groupName")
        config = cls(
            group_name=as_str(name, what + ".groupName") if name is not None else (group_name or "")
        )
        for key, attr in cls._BOOLS.items():
            if obj.get(key) is not None:
                setattr(config, attr, as_bool(obj[key], f"{what}.{key}"))
        for key, attr in cls._INTS.items():
            if obj.get(key) is not None:
                setattr(config, attr, as_int(obj[key], f"{what}.{key}"))
        if obj.get("groupRetryPolicy") is not None:
            config.group_retry_policy = dict(as_object(obj["groupRetryPolicy"], what + ".groupRetryPolicy"))
        if obj.get("subscriptionDataSet") is not None:
            items = obj["subscriptionDataSet"]
            if not isinstance(items, list):
                raise ConfigFileError(f"{what}.subscriptionDataSet: expected a list, got {items!r}")
            config.subscription_data_set = [dict(as_object(i, what + ".subscriptionDataSet")) for i in items]
        config.attributes = str_map(obj.get("attributes"), what + ".attributes")
        return config
