"""Access control as RocketMQ's ACL 1.0 (`PlainAccessValidator`, `PlainPermissionManager`,
`PlainAccessResource`), from a `plain_acl.yml` in RocketMQ's format:

    globalWhiteRemoteAddresses: ["10.10.103.*", "192.168.0.*"]
    accounts:
      - accessKey: RocketMQ
        secretKey: 12345678
        whiteRemoteAddress: 192.168.0.*
        admin: false
        defaultTopicPerm: DENY
        defaultGroupPerm: SUB
        topicPerms: [topicA=DENY, topicB=PUB|SUB, topicC=SUB]
        groupPerms: [groupA=DENY, groupB=PUB|SUB, groupC=SUB]

A request from a globally white-listed address passes; otherwise it must carry an `AccessKey` of a known
account and a valid `Signature` (HMAC-SHA1 of its sorted extFields and body, `remoting.acl`), unless the
account's own white address matches. Then the request's resources need the account's permission: sends
need PUB on the topic, pulls, offsets, queries and heartbeats SUB on the topic and the group (a retry topic
`%RETRY%<group>` is its group), and administration (creating topics and groups, reading every config)
needs an admin account, and so do the broker-wide statistics (runtime info, the stats history, every
subscription group); a topic's statistics need SUB on it, a group's consume statistics SUB on the group and
its topics. Refusals are `AclError`s whose message names the access key and the resource,
never a secret. The file is read again when it changes (checked at most once a second); a file that cannot
be read keeps the previous rules and logs why.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from ..common.topic import RETRY_GROUP_TOPIC_PREFIX
from ..remoting import RemotingCommand, RequestCode, send_header_v1
from ..remoting.acl import ACCESS_KEY, SIGNATURE, signature_of

log = logging.getLogger(__name__)

DENY, PUB, SUB = 1, 2, 4
_PERMS = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}

ADMIN_CODES = frozenset({
    RequestCode.UPDATE_AND_CREATE_TOPIC, RequestCode.UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
    RequestCode.DELETE_TOPIC_IN_BROKER, RequestCode.DELETE_TOPIC_IN_NAMESRV,
    RequestCode.GET_ALL_TOPIC_CONFIG, RequestCode.GET_ALL_CONSUMER_OFFSET, RequestCode.GET_ALL_DELAY_OFFSET,
    # broker-wide reads: every topic's and group's numbers at once (RocketMQ 5's ACL 2.0 asks for the
    # cluster or every group; ACL 1.0 has no resource for them): admin accounts only
    RequestCode.GET_ALL_SUBSCRIPTIONGROUP_CONFIG, RequestCode.GET_BROKER_RUNTIME_INFO,
    RequestCode.GET_BROKER_STATS_HISTORY,
})
SEND_CODES = frozenset({RequestCode.SEND_MESSAGE, RequestCode.SEND_MESSAGE_V2, RequestCode.SEND_BATCH_MESSAGE})


class AclError(Exception):
    """A request the ACL refuses; the message says why (no secret in it)."""


class AclConfigError(ValueError):
    """A plain_acl.yml that cannot be used; the message names the file and the problem."""


def parse_perm(text: Any, where: str) -> int:
    perm = _PERMS.get(str(text).strip().upper().replace(" ", ""))
    if perm is None:
        raise AclConfigError(f"{where}: permission {text!r} is not one of DENY, PUB, SUB, PUB|SUB")
    return perm


class RemoteAddressStrategy:
    """RocketMQ's white-address patterns (`RemoteAddressStrategyFactory`): `*` or empty for any, an exact
    address, a trailing `*` per segment (`192.168.0.*`), a last segment list (`192.168.1.{1,2}` or
    `192.168.1.1,2`), a last segment range (`192.168.1.1-5`), or a CIDR block."""

    def __init__(self, pattern: str) -> None:
        self.pattern = p = pattern.strip()
        self._any = p in ("", "*")
        self._network: ipaddress.IPv4Network | ipaddress.IPv6Network | None = None
        self._regex: re.Pattern[str] | None = None
        if self._any:
            return
        if "/" in p:
            self._network = ipaddress.ip_network(p, strict=False)
            return
        head, _, last = p.rpartition(".")
        if last.startswith("{") and last.endswith("}"):
            last = last[1:-1]
        parts = []
        for seg in p.split(".")[:-1] if head else []:
            parts.append(r"\d{1,3}" if seg == "*" else re.escape(seg))
        if not head:
            self._regex = re.compile(re.escape(p) + "$")
            return
        if last == "*":
            tail = r"\d{1,3}"
        elif "," in last:
            tail = "(?:" + "|".join(re.escape(x.strip()) for x in last.split(",")) + ")"
        elif "-" in last:
            lo, hi = (int(x) for x in last.split("-", 1))
            tail = "(?:" + "|".join(str(i) for i in range(lo, hi + 1)) + ")"
        else:
            tail = re.escape(last)
        self._regex = re.compile(r"\.".join([*parts, tail]) + "$")

    def matches(self, address: str) -> bool:
        if self._any:
            return True
        if address.startswith("["):
            host = address[1:address.find("]")]
        elif address.count(":") == 1:
            host = address.split(":", 1)[0]
        else:
            host = address
        if self._network is not None:
            try:
                return ipaddress.ip_address(host) in self._network
            except ValueError:
                return False
        assert self._regex is not None
        return bool(self._regex.match(host))


@dataclass
class Account:
    """One entry of `accounts` (`PlainAccessConfig`)."""

    access_key: str
    secret_key: str = field(repr=False)
    white_remote_address: RemoteAddressStrategy | None = None
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    topic_perms: dict[str, int] = field(default_factory=dict)
    group_perms: dict[str, int] = field(default_factory=dict)


@dataclass
class AclRules:
    """The whole file: global white addresses and accounts by access key."""

    global_white: list[RemoteAddressStrategy] = field(default_factory=list)
    accounts: dict[str, Account] = field(default_factory=dict)


def _perm_list(items: Any, where: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items or []:
        name, sep, perm = str(item).partition("=")
        if not sep or not name.strip():
            raise AclConfigError(f"{where}: {item!r} is not of the form name=PERM")
        out[name.strip()] = parse_perm(perm, f"{where} {name.strip()}")
    return out


def load_rules(path: str) -> AclRules:
    try:
        with open(path, encoding="utf-8") as fh:
            doc = yaml.safe_load(fh) or {}
    except OSError as e:
        raise AclConfigError(f"{path}: {e.strerror or e}") from None
    except yaml.YAMLError as e:
        raise AclConfigError(f"{path}: not valid YAML: {e}") from None
    if not isinstance(doc, dict):
        raise AclConfigError(f"{path}: expected a mapping with globalWhiteRemoteAddresses and accounts")
    rules = AclRules([RemoteAddressStrategy(str(a)) for a in doc.get("globalWhiteRemoteAddresses") or []])
    for i, acc in enumerate(doc.get("accounts") or []):
        where = f"{path}: accounts[{i}]"
        if not isinstance(acc, dict) or not acc.get("accessKey") or not acc.get("secretKey"):
            raise AclConfigError(f"{where}: an account needs accessKey and secretKey")
        key = str(acc["accessKey"])
        if len(str(acc["secretKey"])) < 6:
            raise AclConfigError(f"{where} ({key}): secretKey must have at least 6 characters")
        white = acc.get("whiteRemoteAddress")
        rules.accounts[key] = Account(
            key, str(acc["secretKey"]), RemoteAddressStrategy(str(white)) if white else None,
            bool(acc.get("admin", False)), parse_perm(acc.get("defaultTopicPerm", "DENY"), where),
            parse_perm(acc.get("defaultGroupPerm", "DENY"), where), _perm_list(acc.get("topicPerms"), where),
            _perm_list(acc.get("groupPerms"), where))
    return rules


def resources(cmd: RemotingCommand) -> list[tuple[str, str, int]]:
    """(kind, name, needed permission) of a request, as `PlainAccessResource.parse` lists them."""
    ext = cmd.ext_fields
    code = cmd.code
    out: list[tuple[str, str, int]] = []

    def topic(name: Any, perm: int) -> None:
        if name:
            name = str(name)
            if name.startswith(RETRY_GROUP_TOPIC_PREFIX):
                out.append(("group", name[len(RETRY_GROUP_TOPIC_PREFIX):], SUB))
            else:
                out.append(("topic", name, perm))

    def group(name: Any) -> None:
        if name:
            out.append(("group", str(name), SUB))

    if code in SEND_CODES:
        topic(send_header_v1(ext).get("topic"), PUB)
    elif code == RequestCode.END_TRANSACTION:
        topic(ext.get("topic"), PUB)
    elif code == RequestCode.CONSUMER_SEND_MSG_BACK:
        group(ext.get("group"))
    elif code in (RequestCode.PULL_MESSAGE, RequestCode.QUERY_CONSUMER_OFFSET, RequestCode.UPDATE_CONSUMER_OFFSET,
                  RequestCode.POP_MESSAGE, RequestCode.ACK_MESSAGE, RequestCode.CHANGE_MESSAGE_INVISIBLETIME):
        topic(ext.get("topic"), SUB)
        group(ext.get("consumerGroup"))
    elif code == RequestCode.BATCH_ACK_MESSAGE:
        try:
            acks = json.loads(cmd.body or b"{}").get("acks") or []
        except (ValueError, AttributeError):
            acks = []
        for a in acks if isinstance(acks, list) else []:
            if isinstance(a, dict):
                topic(a.get("t"), SUB)
                group(a.get("c"))
    elif code in (RequestCode.QUERY_MESSAGE, RequestCode.QUERY_STREAM, RequestCode.GET_TOPIC_STATS_INFO,
                  RequestCode.QUERY_TRANSACTION_ENDS):
        topic(ext.get("topic"), SUB)
    elif code == RequestCode.GET_CONSUME_STATS:  # ACL 2.0's GET on the group and its topics
        group(ext.get("consumerGroup"))
        topic(ext.get("topic"), SUB)
        for name in str(ext.get("topicList") or "").split(";"):
            topic(name, SUB)
    elif code in (RequestCode.UNREGISTER_CLIENT, RequestCode.GET_CONSUMER_LIST_BY_GROUP):
        group(ext.get("consumerGroup"))
    elif code == RequestCode.HEART_BEAT:
        try:
            data = json.loads(cmd.body or b"{}")
        except ValueError:
            data = {}
        for cd in data.get("consumerDataSet") or [] if isinstance(data, dict) else []:
            if isinstance(cd, dict):
                group(cd.get("groupName"))
                for sd in cd.get("subscriptionDataSet") or []:
                    if isinstance(sd, dict):
                        topic(sd.get("topic"), SUB)
    return out


class PlainAccessValidator:
    """Validates requests against a plain_acl.yml (see the module docstring); thread-safe."""

    def __init__(self, path: str | os.PathLike[str], reload_interval: float = 1.0) -> None:
        self.path = os.fspath(path)
        self.reload_interval = reload_interval
        self._lock = threading.Lock()
        self._rules = load_rules(self.path)
        self._mtime = self._stat()
        self._checked = time.monotonic()

    def _stat(self) -> tuple[float, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime, st.st_size)

    def rules(self) -> AclRules:
        """The rules in force, read again first when the file changed (checked at most once a second)."""
        now = time.monotonic()
        if now - self._checked >= self.reload_interval:
            with self._lock:
                if now - self._checked >= self.reload_interval:
                    self._checked = now
                    stamp = self._stat()
                    if stamp != self._mtime:
                        self._mtime = stamp
                        try:
                            self._rules = load_rules(self.path)
                            log.info("ACL rules reloaded from %s", self.path)
                        except AclConfigError as e:
                            log.error("ACL file changed but cannot be used, keeping the previous rules: %s", e)
        return self._rules

    def validate(self, cmd: RemotingCommand, remote_address: str) -> None:
        """Raise `AclError` when the ACL refuses `cmd` from `remote_address`."""
        rules = self.rules()
        if any(w.matches(remote_address) for w in rules.global_white):
            return
        access_key = cmd.ext_fields.get(ACCESS_KEY)
        if not access_key:
            raise AclError(f"No accessKey is configured: request code {cmd.code} from {remote_address} is not signed")
        account = rules.accounts.get(str(access_key))
        if account is None:
            raise AclError(f"No acl config for {access_key}")
        if account.white_remote_address is not None and account.white_remote_address.matches(remote_address):
            return
        given = str(cmd.ext_fields.get(SIGNATURE) or "")
        if not hmac.compare_digest(given.encode("utf-8", "surrogatepass"), signature_of(cmd, account.secret_key).encode()):
            raise AclError(f"Check signature failed for accessKey={access_key}")
        if account.admin:
            return
        if cmd.code in ADMIN_CODES:
            raise AclError(f"Need admin permission for request code={cmd.code}, but accessKey={access_key} is "
                           f"not admin")
        for kind, name, needed in resources(cmd):
            perms, default = ((account.topic_perms, account.default_topic_perm) if kind == "topic"
                              else (account.group_perms, account.default_group_perm))
            have = perms.get(name, default)
            if have == DENY or not have & needed:
                want = "PUB" if needed == PUB else "SUB"
                raise AclError(f"No permission for {kind} {name}: accessKey={access_key} needs {want}")
