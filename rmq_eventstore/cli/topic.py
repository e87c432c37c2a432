"""`rmq-eventstore topic-delete TOPIC`: delete a topic on a running broker (RocketMQ's `mqadmin deleteTopic`).

Its config, consume queues, consumer offsets, pop retry topics and route go; its commitlog records stay until
the commitlog files expire. System topics are refused. The broker is named as for the `group-*` commands
(`--url file:///path/to/store` or `rmq://host:9876`, or `--namesrv host:port`).
"""

from __future__ import annotations

import argparse

from ..client import Admin, MQBrokerError, RemotingError
from ..common.topic import TopicValidationError
from .group import _add_broker, _namesrv
from .output import EXIT_ERROR, EXIT_OK, CliError, Command, stdout


def configure_delete(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    _add_broker(p)


def run_delete(args: argparse.Namespace) -> int:
    namesrv = _namesrv(args)
    try:
        with Admin(namesrv, access_key=args.access_key, secret_key=args.secret_key) as admin:
            admin.delete_topic(args.topic)
    except (TopicValidationError, ValueError) as e:
        raise CliError(f"cannot delete {args.topic!r}: {e}", EXIT_ERROR) from None
    except MQBrokerError as e:
        raise CliError(f"the broker refused to delete {args.topic!r}: {e}", EXIT_ERROR) from None
    except RemotingError as e:
        raise CliError(f"no broker reachable at {namesrv}: {e}", EXIT_ERROR) from None
    stdout().write(f"deleted topic {args.topic}\n")
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("topic-delete", "delete a topic on a running broker (config, queues, offsets, route)", configure_delete,
            run_delete, takes_path=False),
]
