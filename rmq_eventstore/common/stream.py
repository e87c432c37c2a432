"""Stream ids of expected-version appends: what the client checks before sending and the broker before
storing (a stream id is an index key, so it has the rules of one)."""

from __future__ import annotations

MAX_STREAM_ID_LENGTH = 255


class StreamIdError(ValueError):
    """A stream id that cannot be stored (empty, too long, or with blanks or separators)."""


def validate_stream_id(stream: str) -> None:
    if not isinstance(stream, str) or not stream:
        raise StreamIdError("a stream id must be a non-empty string")
    if len(stream.encode("utf-8")) > MAX_STREAM_ID_LENGTH:
        raise StreamIdError(f"stream id {stream[:40]!r}... is longer than {MAX_STREAM_ID_LENGTH} bytes")
    if any(c.isspace() or c in "\x01\x02" for c in stream):
        raise StreamIdError(f"stream id {stream!r} contains a blank or a control separator (it is an index key)")


__all__ = ["MAX_STREAM_ID_LENGTH", "StreamIdError", "validate_stream_id"]
