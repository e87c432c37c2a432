"""Tag filters of subscriptions, shared by the broker (consume-queue and commitlog checks) and clients
(parsing a subscription expression)."""

from __future__ import annotations

from .message import MessageExt
from .tags import tags_string_to_tags_code


class MessageFilter:
    """Tag filter of a subscription (`ExpressionMessageFilter` for TAG expressions, spec §4).

    `"*"` or empty matches everything; `"TagA || TagB"` matches those tags' hash codes in the consume
    queue. Hash collisions pass the queue filter, so `is_matched_by_commit_log` re-checks the tag text.
    """

    def __init__(self, expression: str | None = None) -> None:
        expr = (expression or "").strip()
        self.expression = expr
        self.match_all = expr in ("", "*")
        self.tags = {t.strip() for t in expr.split("||") if t.strip()} if not self.match_all else set()
        self.code_set = {tags_string_to_tags_code(t) for t in self.tags}

    def is_matched_by_consume_queue(self, tags_code: int) -> bool:
        if self.match_all:
            return True
        if tags_code < -0x80000000 or tags_code > 0x7FFFFFFF:  # an ext address: no code to compare
            return True
        return tags_code in self.code_set

    def is_matched_by_commit_log(self, msg: MessageExt) -> bool:
        return self.match_all or msg.tags in self.tags
