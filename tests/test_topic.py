"""Topic and group name validation (spec §1.6, §6.1; RocketMQ's TopicValidator + HookUtils)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rmq_eventstore.common.topic import (
    DLQ_GROUP_TOPIC_PREFIX,
    RETRY_GROUP_TOPIC_PREFIX,
    SCHEDULE_TOPIC,
    TopicValidationError,
    dlq_topic,
    is_dlq_topic,
    is_not_allowed_send_topic,
    is_retry_topic,
    is_system_topic,
    is_valid_group,
    is_valid_topic,
    retry_topic,
    validate_group,
    validate_topic,
)

VALID = [
    "TopicTest",
    "a",
    "0",
    "%RETRY%GID_demo",
    "%DLQ%GID_demo",
    "%LMQ%lmq123",
    "SCHEDULE_TOPIC_XXXX",
    "rmq_sys_SYNC_BROKER_MEMBER_broker-a",
    "a|b",
    "-_-",
    "x" * 127,
]


@pytest.mark.parametrize("topic", VALID)
def test_valid_topics(topic: str) -> None:
    validate_topic(topic)
    assert is_valid_topic(topic)


def test_constants() -> None:
    assert RETRY_GROUP_TOPIC_PREFIX == "%RETRY%"
    assert DLQ_GROUP_TOPIC_PREFIX == "%DLQ%"
    assert SCHEDULE_TOPIC == "SCHEDULE_TOPIC_XXXX"
    assert retry_topic("g") == "%RETRY%g"
    assert dlq_topic("g") == "%DLQ%g"


def test_length_limit_127_bytes() -> None:
    validate_topic("T" * 127)
    with pytest.raises(TopicValidationError) as exc:
        validate_topic("T" * 128)
    message = str(exc.value)
    assert repr("T" * 128) in message
    assert "128 bytes" in message and "127" in message
    assert not is_valid_topic("T" * 128)


def test_long_retry_topic_allowed_up_to_255_bytes() -> None:
    topic = RETRY_GROUP_TOPIC_PREFIX + "g" * (255 - len(RETRY_GROUP_TOPIC_PREFIX))
    assert len(topic) == 255
    validate_topic(topic)
    assert is_valid_topic(topic)
    validate_topic(RETRY_GROUP_TOPIC_PREFIX + "g" * 150)
    with pytest.raises(TopicValidationError, match="255"):
        validate_topic(topic + "g")
    assert not is_valid_topic(topic + "g")
    # Only the %RETRY% prefix is exempt from the 127 limit.
    with pytest.raises(TopicValidationError, match="127"):
        validate_topic(DLQ_GROUP_TOPIC_PREFIX + "g" * 130)


@pytest.mark.parametrize(
    ("topic", "reason"),
    [
        ("../x", "illegal characters"),
        ("a/b", "illegal characters"),
        (".", "illegal characters"),
        ("..", "illegal characters"),
        ("/etc/passwd", "illegal characters"),
        ("a\\b", "illegal characters"),
        ("nul\x00byte", "illegal characters"),
        ("has space", "illegal characters"),
        ("Topic中文", "illegal characters"),
        ("emoji😀", "illegal characters"),
        ("tab\there", "illegal characters"),
        ("trailing\n", "illegal characters"),
        ("a.b", "illegal characters"),
        ("a@b", "illegal characters"),
        ("a:b", "illegal characters"),
        ("", "blank"),
        ("   ", "blank"),
        ("\t\n", "blank"),
    ],
)
def test_invalid_topics_say_why(topic: str, reason: str) -> None:
    with pytest.raises(TopicValidationError) as exc:
        validate_topic(topic)
    assert reason in str(exc.value)
    assert repr(topic) in str(exc.value)
    assert isinstance(exc.value, ValueError)
    assert not is_valid_topic(topic)


def test_illegal_characters_are_named() -> None:
    with pytest.raises(TopicValidationError) as exc:
        validate_topic("../x")
    assert "'.'" in str(exc.value) and "'/'" in str(exc.value)


def test_long_topic_with_bad_chars_reports_chars() -> None:
    # The character rule is checked before the length rule, as in RocketMQ.
    with pytest.raises(TopicValidationError, match="illegal characters"):
        validate_topic("é" * 200)


@pytest.mark.parametrize("value", [None, 123, b"TopicTest", ["a"]])
def test_non_string_refused(value: object) -> None:
    with pytest.raises(TopicValidationError, match="must be a str"):
        validate_topic(value)  # type: ignore[arg-type]
    assert not is_valid_topic(value)  # type: ignore[arg-type]


@given(st.text(max_size=300))
def test_is_valid_matches_validate(topic: str) -> None:
    try:
        validate_topic(topic)
        raised = False
    except TopicValidationError:
        raised = True
    assert is_valid_topic(topic) is (not raised)
    if not raised:
        # Every accepted name is safe as a single path component.
        assert "/" not in topic and "\\" not in topic and topic not in (".", "..")
        assert topic.isascii() and len(topic.encode()) <= 255


def test_groups() -> None:
    validate_group("GID_demo")
    validate_group("g" * 255)
    assert is_valid_group("CID_ONSAPI_OWNER")
    with pytest.raises(TopicValidationError, match="maximum is 255"):
        validate_group("g" * 256)
    for bad in ["", " ", "a@b", "../g", "g/h", "組"]:
        with pytest.raises(TopicValidationError):
            validate_group(bad)
        assert not is_valid_group(bad)


def test_system_topic_helpers() -> None:
    assert is_system_topic("SCHEDULE_TOPIC_XXXX")
    assert is_system_topic("TBW102")
    assert is_system_topic("rmq_sys_wheel_timer")
    assert not is_system_topic("TopicTest")
    assert is_not_allowed_send_topic("RMQ_SYS_TRANS_HALF_TOPIC")
    assert not is_not_allowed_send_topic("TopicTest")
    assert is_retry_topic("%RETRY%g") and not is_retry_topic("g")
    assert is_dlq_topic("%DLQ%g") and not is_dlq_topic("%RETRY%g")
