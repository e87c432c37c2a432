"""kombu transport on RocketMQ 5's POP / ACK: `rmq_eventstore.kombu.Transport`.

Importing this package registers the URL scheme `rocketmq` in kombu's `TRANSPORT_ALIASES`, so that
`Connection("rocketmq://127.0.0.1:9876//")` (a name server) and `Connection("rocketmq:///srv/var/store")`
(the broker owning a local store, found or started) work; kombu 5.7 refuses URL schemes it does not know.
Without the import, name the class: `Connection(url, transport="rmq_eventstore.kombu:Transport")`, or in
Celery `broker_transport = "rmq_eventstore.kombu:Transport"`.
"""

from __future__ import annotations

from kombu.transport import TRANSPORT_ALIASES

from .names import queue_name, topic_name
from .transport import Channel, QoS, Transport

SCHEME = "rocketmq"
TRANSPORT_ALIASES.setdefault(SCHEME, "rmq_eventstore.kombu:Transport")

__all__ = ["SCHEME", "Channel", "QoS", "Transport", "queue_name", "topic_name"]
