"""Topic (and consumer group) name rules, as RocketMQ enforces them (spec §1.6, §6.1).

RocketMQ checks a topic twice: `TopicValidator.validateTopic` (not blank, only the characters
`[%|a-zA-Z0-9_-]`, at most 127 characters) when a client sends or creates a topic, and the broker's put
hook `HookUtils.checkBeforePutMessage` (more than 127 UTF-8 bytes only for `%RETRY%` topics, never more
than 255).  `validate_topic` applies the union of both, because a topic name becomes a directory name
under `consumequeue/`: an unchecked one (`../x`, `a/b`, `..`) would be a path traversal.

It is called on every put, so the common case is one length comparison plus one precompiled
`re.fullmatch` (never `re.match` with `$`, which would accept a trailing newline).
"""

from __future__ import annotations

import re

__all__ = [
    "AUTO_CREATE_TOPIC_KEY_TOPIC",
    "DLQ_GROUP_TOPIC_PREFIX",
    "GROUP_MAX_LENGTH",
    "LMQ_PREFIX",
    "NOT_ALLOWED_SEND_TOPIC_SET",
    "RETRY_GROUP_TOPIC_PREFIX",
    "RETRY_TOPIC_MAX_LENGTH",
    "RMQ_SYS_BENCHMARK_TOPIC",
    "RMQ_SYS_OFFSET_MOVED_EVENT",
    "RMQ_SYS_SCHEDULE_TOPIC",
    "RMQ_SYS_SELF_TEST_TOPIC",
    "RMQ_SYS_TRACE_TOPIC",
    "RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC",
    "RMQ_SYS_TRANS_HALF_TOPIC",
    "RMQ_SYS_TRANS_OP_HALF_TOPIC",
    "SCHEDULE_TOPIC",
    "SYSTEM_TOPIC_PREFIX",
    "SYSTEM_TOPIC_SET",
    "TOPIC_MAX_LENGTH",
    "TopicValidationError",
    "VALID_NAME_PATTERN",
    "dlq_topic",
    "is_dlq_topic",
    "is_lmq_topic",
    "is_not_allowed_send_topic",
    "is_retry_topic",
    "is_system_topic",
    "is_valid_group",
    "is_valid_topic",
    "retry_topic",
    "validate_group",
    "validate_topic",
]

# --- constants (C/MixAll.java, C/topic/TopicValidator.java) -------------------------------------------
RETRY_GROUP_TOPIC_PREFIX = "%RETRY%"
DLQ_GROUP_TOPIC_PREFIX = "%DLQ%"
LMQ_PREFIX = "%LMQ%"
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

AUTO_CREATE_TOPIC_KEY_TOPIC = "TBW102"
RMQ_SYS_SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
SCHEDULE_TOPIC = RMQ_SYS_SCHEDULE_TOPIC
RMQ_SYS_BENCHMARK_TOPIC = "BenchmarkTest"
RMQ_SYS_TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
RMQ_SYS_TRACE_TOPIC = "RMQ_SYS_TRACE_TOPIC"
RMQ_SYS_TRANS_OP_HALF_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"
RMQ_SYS_SELF_TEST_TOPIC = "SELF_TEST_TOPIC"
RMQ_SYS_OFFSET_MOVED_EVENT = "OFFSET_MOVED_EVENT"
RMQ_SYS_WHEEL_TIMER_TOPIC = "rmq_sys_wheel_timer"  # TimerMessageStore.TIMER_TOPIC: timer messages until due

SYSTEM_TOPIC_SET: frozenset[str] = frozenset(
    {
        AUTO_CREATE_TOPIC_KEY_TOPIC,
        RMQ_SYS_SCHEDULE_TOPIC,
        RMQ_SYS_BENCHMARK_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRACE_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
        RMQ_SYS_SELF_TEST_TOPIC,
        RMQ_SYS_OFFSET_MOVED_EVENT,
    }
)
"""RocketMQ's built-in system topics (the broker adds a few more at runtime, e.g. its cluster name)."""

NOT_ALLOWED_SEND_TOPIC_SET: frozenset[str] = frozenset(
    {
        RMQ_SYS_SCHEDULE_TOPIC,
        RMQ_SYS_TRANS_HALF_TOPIC,
        RMQ_SYS_TRANS_OP_HALF_TOPIC,
        RMQ_SYS_TRANS_CHECK_MAX_TIME_TOPIC,
        RMQ_SYS_SELF_TEST_TOPIC,
        RMQ_SYS_OFFSET_MOVED_EVENT,
    }
)
"""Topics a client may not send to directly (the broker writes them itself)."""

TOPIC_MAX_LENGTH = 127
"""Longest ordinary topic, in UTF-8 bytes (V1 records hold the length in a signed byte)."""
RETRY_TOPIC_MAX_LENGTH = 255
"""Longest `%RETRY%` topic, in bytes (such records use the V2 magic with a 2-byte topic length)."""
GROUP_MAX_LENGTH = 255
"""Longest consumer group name (`Validators.CHARACTER_MAX_LENGTH`)."""

VALID_NAME_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")
"""Allowed topic/group characters; always use `fullmatch` (RocketMQ's `^[%|a-zA-Z0-9_-]+$`)."""

_fullmatch = VALID_NAME_PATTERN.fullmatch


class TopicValidationError(ValueError):
    """A topic or group name RocketMQ would refuse; raised before the name reaches the disk or a file name."""


def _illegal_name_message(kind: str, name: str) -> str:
    bad = sorted({ch for ch in name if not _fullmatch(ch)})
    shown = ", ".join(repr(ch) for ch in bad[:8])
    return f"{kind} {name!r} contains illegal characters ({shown}); only ^[%|a-zA-Z0-9_-]+$ is allowed"


def validate_topic(topic: str) -> None:
    """Raise `TopicValidationError` unless `topic` is a name RocketMQ accepts for a put.

    Rules (checked in RocketMQ's order): not empty or blank; only `[%|a-zA-Z0-9_-]`; at most 127 bytes,
    or at most 255 bytes for topics starting with `%RETRY%`.  Valid names are pure ASCII, so characters
    and UTF-8 bytes coincide once the character check has passed.
    """
    # Fast path: the usual short, well-formed topic.
    if type(topic) is str and len(topic) <= TOPIC_MAX_LENGTH and _fullmatch(topic) is not None:
        return
    if not isinstance(topic, str):
        raise TopicValidationError(f"topic must be a str, not {type(topic).__name__}: {topic!r}")
    if not topic or topic.isspace():
        raise TopicValidationError(f"topic {topic!r} is blank")
    if _fullmatch(topic) is None:
        raise TopicValidationError(_illegal_name_message("topic", topic))
    size = len(topic)  # ASCII only from here on: len == UTF-8 byte count
    if size > RETRY_TOPIC_MAX_LENGTH:
        raise TopicValidationError(
            f"topic {topic!r} is {size} bytes long; no topic may exceed {RETRY_TOPIC_MAX_LENGTH} bytes"
        )
    if size > TOPIC_MAX_LENGTH and not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        raise TopicValidationError(
            f"topic {topic!r} is {size} bytes long; the maximum is {TOPIC_MAX_LENGTH} bytes "
            f"(only {RETRY_GROUP_TOPIC_PREFIX} topics may be up to {RETRY_TOPIC_MAX_LENGTH})"
        )


def is_valid_topic(topic: str) -> bool:
    """True if `validate_topic(topic)` would not raise."""
    if type(topic) is not str:
        return False
    size = len(topic)
    if size <= TOPIC_MAX_LENGTH:
        return _fullmatch(topic) is not None
    if size > RETRY_TOPIC_MAX_LENGTH or not topic.startswith(RETRY_GROUP_TOPIC_PREFIX):
        return False
    return _fullmatch(topic) is not None


def validate_group(group: str) -> None:
    """Raise `TopicValidationError` unless `group` is a valid consumer/producer group name.

    Same character set as topics, at most 255 characters (client `Validators.checkGroup`).  A group is
    embedded in `%RETRY%<group>`/`%DLQ%<group>` topics and in `topic@group` offset keys, so `@`, `/`
    and friends must never get through.
    """
    if type(group) is str and len(group) <= GROUP_MAX_LENGTH and _fullmatch(group) is not None:
        return
    if not isinstance(group, str):
        raise TopicValidationError(f"group must be a str, not {type(group).__name__}: {group!r}")
    if not group or group.isspace():
        raise TopicValidationError(f"group {group!r} is blank")
    if _fullmatch(group) is None:
        raise TopicValidationError(_illegal_name_message("group", group))
    raise TopicValidationError(
        f"group {group!r} is {len(group)} characters long; the maximum is {GROUP_MAX_LENGTH}"
    )


def is_valid_group(group: str) -> bool:
    """True if `validate_group(group)` would not raise."""
    return type(group) is str and len(group) <= GROUP_MAX_LENGTH and _fullmatch(group) is not None


def is_system_topic(topic: str) -> bool:
    """True for RocketMQ's built-in topics and any topic starting with `rmq_sys_`."""
    return topic in SYSTEM_TOPIC_SET or topic.startswith(SYSTEM_TOPIC_PREFIX)


def is_not_allowed_send_topic(topic: str) -> bool:
    """True for system topics a client may not send to (schedule, transaction half/op, ...)."""
    return topic in NOT_ALLOWED_SEND_TOPIC_SET


def is_retry_topic(topic: str) -> bool:
    """True for `%RETRY%<group>` topics."""
    return topic.startswith(RETRY_GROUP_TOPIC_PREFIX)


def is_dlq_topic(topic: str) -> bool:
    """True for `%DLQ%<group>` dead-letter topics."""
    return topic.startswith(DLQ_GROUP_TOPIC_PREFIX)


def is_lmq_topic(topic: str) -> bool:
    """True for light message queue topics (`%LMQ%...`)."""
    return topic.startswith(LMQ_PREFIX)


def retry_topic(group: str) -> str:
    """The retry topic of a consumer group (`MixAll.getRetryTopic`)."""
    return RETRY_GROUP_TOPIC_PREFIX + group


def dlq_topic(group: str) -> str:
    """The dead-letter topic of a consumer group (`MixAll.getDLQTopic`)."""
    return DLQ_GROUP_TOPIC_PREFIX + group
