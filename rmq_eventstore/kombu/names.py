"""kombu queue names ↔ RocketMQ topic names, reversibly and without collisions.

A kombu (AMQP) queue may be named with any text (`celery`, `celery.pidbox`, `worker@host.celery.pidbox`,
`celeryev.4b1c…`); a RocketMQ topic only with `[%|a-zA-Z0-9_-]`, at most 127 bytes. The mapping:

- every queue topic starts with `kombu-` (after the namespace, if any), so a kombu queue never lands on
  a topic the event store or another application uses, nor on a system topic;
- letters, digits and `-` stand for themselves; `_` is the escape character:
  `__` is `_`, `_P` is `.`, `_A` is `@`, `_C` is `:`, and `_xx` (two lowercase hex digits) is one byte
  of the name's UTF-8 for every other character;
- a namespace `ns` (transport option `namespace`) is put in front as `ns%`, RocketMQ 5's namespace
  convention (`NamespaceUtil.wrapNamespace`); it must itself be a legal name without `%`.

The escaping is a prefix code, so `queue_name(topic_name(q)) == q` for every `q` and two queues never
share a topic. A name that maps to more than 127 bytes is refused (`ValueError`) rather than shortened,
which would lose the round trip.
"""

from __future__ import annotations

import re

from ..common.topic import TOPIC_MAX_LENGTH, TopicValidationError, validate_topic

QUEUE_PREFIX = "kombu-"
SYSTEM_PREFIX = "kombu_sys_"
NAMESPACE_SEP = "%"
_PLAIN = re.compile(r"[A-Za-z0-9-]")
_SHORT = {"_": "_", ".": "P", "@": "A", ":": "C"}
_SHORT_BACK = {v: k for k, v in _SHORT.items()}
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]{1,64}")

__all__ = ["QUEUE_PREFIX", "SYSTEM_PREFIX", "escape", "queue_name", "system_topic", "topic_name", "unescape",
           "validate_namespace"]


def validate_namespace(namespace: str) -> str:
    """The namespace if it is usable (`[A-Za-z0-9_-]`, 1..64 characters) or '' for none."""
    if not namespace:
        return ""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} must be 1..64 characters of [A-Za-z0-9_-]")
    return namespace


def escape(name: str) -> str:
    """`name` in the topic alphabet (see the module docstring)."""
    out = []
    for ch in name:
        if _PLAIN.fullmatch(ch):
            out.append(ch)
        elif ch in _SHORT:
            out.append("_" + _SHORT[ch])
        else:
            out.extend(f"_{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


def unescape(text: str) -> str:
    """The inverse of `escape`; raises ValueError for text `escape` cannot produce."""
    out = bytearray()
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch != "_":
            if not _PLAIN.fullmatch(ch):
                raise ValueError(f"{text!r}: {ch!r} at {i} is not produced by escape")
            out += ch.encode()
            i += 1
            continue
        nxt = text[i + 1:i + 2]
        if nxt in _SHORT_BACK:
            out += _SHORT_BACK[nxt].encode()
            i += 2
            continue
        pair = text[i + 1:i + 3]
        if len(pair) != 2 or any(c not in "0123456789abcdef" for c in pair):
            raise ValueError(f"{text!r}: bad escape at {i}")
        b = int(pair, 16)
        if b < 0x80 and (_PLAIN.fullmatch(chr(b)) or chr(b) in _SHORT):
            raise ValueError(f"{text!r}: {chr(b)!r} is escaped but escape writes it otherwise")
        out.append(b)
        i += 3
    return out.decode("utf-8")


def _wrap(namespace: str, topic: str) -> str:
    return f"{namespace}{NAMESPACE_SEP}{topic}" if namespace else topic


def topic_name(queue: str, namespace: str = "") -> str:
    """The topic of kombu queue `queue` (in `namespace`)."""
    if not isinstance(queue, str) or not queue:
        raise ValueError(f"a queue name must be a non-empty string, not {queue!r}")
    topic = _wrap(validate_namespace(namespace), QUEUE_PREFIX + escape(queue))
    if len(topic) > TOPIC_MAX_LENGTH:
        raise ValueError(f"queue {queue!r} maps to topic {topic[:40]}… of {len(topic)} characters; RocketMQ allows "
                         f"{TOPIC_MAX_LENGTH}: use a shorter queue name (or namespace)")
    try:
        validate_topic(topic)
    except TopicValidationError as e:  # pragma: no cover - escape only writes legal characters
        raise ValueError(str(e)) from None
    return topic


def queue_name(topic: str, namespace: str = "") -> str:
    """The kombu queue whose topic is `topic` (the inverse of `topic_name`)."""
    head = _wrap(validate_namespace(namespace), QUEUE_PREFIX)
    if not topic.startswith(head):
        raise ValueError(f"topic {topic!r} is not a kombu queue topic of namespace {namespace!r}")
    return unescape(topic[len(head):])


def system_topic(name: str, namespace: str = "") -> str:
    """The topic of one of the transport's own records (`bindings`): never a queue topic."""
    return _wrap(validate_namespace(namespace), SYSTEM_PREFIX + name)
