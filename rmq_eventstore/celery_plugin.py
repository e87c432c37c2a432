"""The `rocketmq://` URL scheme in every `celery` command, and the `celery rocketmq queues` command.

Celery's command line (`celery ...`, `python -m celery ...`) loads the `celery.commands` entry points of the
installed packages when it starts, before it reads `-b` or the app's `broker_url`. Ours names this module, so
importing it must be cheap (it runs at every `celery` start): it adds `rocketmq` to kombu's
`TRANSPORT_ALIASES` as a string, and the transport (`rmq_eventstore.kombu`) is imported only when a connection
is made. So `celery -b rocketmq://127.0.0.1:9876// worker` works in a fresh interpreter with nothing of ours
imported by the app. Elsewhere (a script using kombu or Celery directly) `import rmq_eventstore.kombu` registers
the scheme, or `broker_transport = "rmq_eventstore.kombu:Transport"` names the class (DESIGN.md, "Selection").
"""

from __future__ import annotations

from typing import Any

import click
from celery.bin.base import CeleryCommand, handle_preload_options
from kombu.transport import TRANSPORT_ALIASES

SCHEME = "rocketmq"
TRANSPORT = "rmq_eventstore.kombu:Transport"

TRANSPORT_ALIASES.setdefault(SCHEME, TRANSPORT)

__all__ = ["SCHEME", "TRANSPORT", "rocketmq"]


@click.group(name=SCHEME)
def rocketmq() -> None:
    """Look at a rocketmq:// broker (rmq_eventstore) as Celery sees it."""


@rocketmq.command(cls=CeleryCommand)
@click.pass_context
@handle_preload_options
def queues(ctx: click.Context, **kwargs: Any) -> None:
    """The kombu queues declared on the app's broker, with the messages ready in each (RabbitMQ's
    `rabbitmqctl list_queues name messages_ready`): declared by any process, e.g. every worker's queues,
    their remote-control (pidbox) queues and the reply queues of `celery inspect`."""
    from .kombu import Channel

    app = ctx.obj.app
    with app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1)
        channel = conn.default_channel
        if not isinstance(channel, Channel):
            raise click.UsageError(f"the broker {conn.as_uri()} is not a {SCHEME}:// broker")
        shared = channel.clients.shared
        shared.refresh()
        names = sorted(shared.queues)
        width = max((len(n) for n in names), default=0)
        for name in names:
            ctx.obj.echo(f"{name:<{width}}  {channel._size(name)}")
