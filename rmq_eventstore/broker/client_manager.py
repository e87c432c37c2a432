"""Who is connected: consumers and producers by group, with their channels (RocketMQ's `ConsumerManager`
and `ProducerManager`, fed by heartbeats, emptied by unregistering, closed connections and silence).

The producer registry is what transaction check-back uses: any live channel of a producer group may be
asked for the state of a half message, so another process of the same application answers when the one
that sent it died.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..common.rng import rng
from ..remoting import RemotingCommand, RequestCode

log = logging.getLogger(__name__)


class Channel(Protocol):
    """A client connection as the broker sees it (the server's connection object implements it)."""

    remote_address: str

    def send_oneway(self, command: RemotingCommand) -> None:
        """Send a request to the client without waiting for an answer (thread-safe)."""


@dataclass
class ClientInfo:
    """One registered client of a group (`ClientChannelInfo` + its subscriptions)."""

    client_id: str
    channel: Any
    language: str
    version: int
    last_update: float
    subscriptions: dict[str, str] = field(default_factory=dict)  # topic -> subString
    consume_type: str = ""
    message_model: str = ""


class _GroupRegistry:
    """Clients by group and client id, guarded by one lock."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._groups: dict[str, dict[str, ClientInfo]] = {}

    def register(self, group: str, info: ClientInfo) -> bool:
        """Add or refresh a client; True when it is new to the group."""
        with self._lock:
            members = self._groups.setdefault(group, {})
            new = info.client_id not in members
            members[info.client_id] = info
            return new

    def unregister(self, group: str, client_id: str) -> bool:
        with self._lock:
            members = self._groups.get(group)
            if members is None or members.pop(client_id, None) is None:
                return False
            if not members:
                del self._groups[group]
            return True

    def members(self, group: str) -> list[ClientInfo]:
        with self._lock:
            return list(self._groups.get(group, {}).values())

    def groups(self) -> list[str]:
        with self._lock:
            return list(self._groups)

    def drop(self, gone_if: Callable[[ClientInfo], bool]) -> list[str]:
        """Remove the clients `gone_if` selects; the groups that lost one."""
        changed = []
        with self._lock:
            for group, members in list(self._groups.items()):
                gone = [cid for cid, info in members.items() if gone_if(info)]
                for cid in gone:
                    del members[cid]
                if gone:
                    changed.append(group)
                if not members:
                    del self._groups[group]
        return changed


class ConsumerManager(_GroupRegistry):
    """Consumers by group with their subscriptions; tells a group's members when membership changes
    (NOTIFY_CONSUMER_IDS_CHANGED), so clustering consumers rebalance their queues."""

    def consumer_ids(self, group: str) -> list[str]:
        return [info.client_id for info in self.members(group)]

    def subscription(self, group: str, topic: str) -> str | None:
        """The subscription expression a live member of `group` registered for `topic`."""
        for info in self.members(group):
            sub = info.subscriptions.get(topic)
            if sub is not None:
                return sub
        return None

    def notify_consumer_ids_changed(self, group: str) -> None:
        """Tell every consumer of the group to rebalance (a oneway NOTIFY_CONSUMER_IDS_CHANGED)."""
        for info in self.members(group):
            send = getattr(info.channel, "send_oneway", None)
            if send is None:
                continue
            try:
                send(RemotingCommand.request(RequestCode.NOTIFY_CONSUMER_IDS_CHANGED, {"consumerGroup": group},
                                             oneway=True))
            except Exception:
                log.debug("notify %s failed", group, exc_info=True)


class ProducerManager(_GroupRegistry):
    """Producers by group with their channels (`ProducerManager`), for transaction check-back."""

    def available_channel(self, group: str) -> Any | None:
        """One live channel of the group (RocketMQ picks any; a random member spreads check-backs), or None."""
        live = [info.channel for info in self.members(group) if getattr(info.channel, "send_oneway", None)]
        return rng.choice(live) if live else None


class ClientManager:
    """Both registries and their housekeeping: closed connections and silent clients are forgotten, and
    consumer groups that lost a member are told to rebalance."""

    def __init__(self, channel_expired_timeout_ms: int) -> None:
        self.consumers = ConsumerManager()
        self.producers = ProducerManager()
        self.channel_expired_timeout_ms = channel_expired_timeout_ms

    def on_channel_closed(self, channel: Any) -> None:
        """Forget every registration made over a closed connection (`doChannelCloseEvent`)."""
        self._drop(lambda info: info.channel is channel)

    def scan_not_active_channels(self) -> None:
        """Drop clients silent for longer than `channel_expired_timeout` (`ClientHousekeepingService`)."""
        limit = time.monotonic() - self.channel_expired_timeout_ms / 1000.0
        self._drop(lambda info: info.last_update < limit)

    def _drop(self, gone_if: Callable[[ClientInfo], bool]) -> None:
        self.producers.drop(gone_if)
        for group in self.consumers.drop(gone_if):
            self.consumers.notify_consumer_ids_changed(group)
