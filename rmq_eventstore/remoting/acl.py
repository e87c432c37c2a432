"""Request signing of RocketMQ's ACL (`AclUtils.combineRequestContent`, `AclSigner`): HMAC-SHA1, base64, over
the values of the request's extFields sorted by name (all but `Signature`) followed by the body. Clients sign
with `sign_request`; the broker recomputes the signature with `signature_of`. Part of the wire protocol, so
it lives with the frame codec."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .command import RemotingCommand

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"


def _text(value: Any) -> str:
    """An extFields value as the client that signed it wrote it (Java's `String.valueOf`)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def combine_request_content(ext_fields: Mapping[str, Any], body: bytes | None) -> bytes:
    """The signed bytes: sorted extFields values (without `Signature`), then the body."""
    text = "".join(_text(ext_fields[k]) for k in sorted(ext_fields) if k != SIGNATURE and ext_fields[k] is not None)
    return text.encode("utf-8") + (body or b"")


def calculate_signature(content: bytes, secret_key: str) -> str:
    return base64.b64encode(hmac.new(secret_key.encode("utf-8"), content, hashlib.sha1).digest()).decode("ascii")


def signature_of(cmd: RemotingCommand, secret_key: str) -> str:
    """The signature `cmd` should carry for `secret_key`."""
    return calculate_signature(combine_request_content(cmd.ext_fields, cmd.body), secret_key)


@dataclass(frozen=True)
class SessionCredentials:
    """An ACL account's keys (`SessionCredentials`); `repr` never shows the secret."""

    access_key: str
    secret_key: str = field(repr=False)
    security_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not self.access_key or not self.secret_key:
            raise ValueError("ACL credentials need both an access key and a secret key")


def sign_request(cmd: RemotingCommand, credentials: SessionCredentials) -> None:
    """Add `AccessKey` (and `SecurityToken`) and the `Signature` of everything else to `cmd`."""
    cmd.ext_fields[ACCESS_KEY] = credentials.access_key
    if credentials.security_token:
        cmd.ext_fields[SECURITY_TOKEN] = credentials.security_token
    cmd.ext_fields.pop(SIGNATURE, None)
    cmd.ext_fields[SIGNATURE] = signature_of(cmd, credentials.secret_key)
