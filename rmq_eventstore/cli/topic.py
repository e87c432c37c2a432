"""`rmq-eventstore topic-create TOPIC [--queues N]` and `topic-delete TOPIC`: create (or widen) and delete a topic
on a running broker (RocketMQ's `mqadmin updateTopic` / `deleteTopic`). Under ACL both need an admin account;
`topic-create` is how an operator makes the topics of accounts that may not create them (a Celery worker's
queues, for one).

`topic-delete`: its config, consume queues, consumer offsets, pop retry topics and route go; its commitlog
records stay until the commitlog files expire. System topics are refused by both. The broker is named as for
the `group-*` commands (`--url file:///path/to/store` or `rmq://host:9876`, or `--namesrv host:port`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from ..client import Admin, MQBrokerError, RemotingError
from ..common.topic import TopicValidationError
from .group import _add_broker, _namesrv
from .output import EXIT_ERROR, EXIT_OK, CliError, Command, stdout


def configure_create(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    p.add_argument("--queues", type=int, default=4, help="read and write queues (default 4; a kombu priority "
                   "queue uses 10, one per priority)")
    _add_broker(p)


def _on_broker(args: argparse.Namespace, verb: str, call: Callable[[Admin], None]) -> None:
    """`call` with an `Admin` of the named broker; a refusal or an unreachable broker is one line (`CliError`)."""
    namesrv = _namesrv(args)
    try:
        with Admin(namesrv, access_key=args.access_key, secret_key=args.secret_key) as admin:
            call(admin)
    except (TopicValidationError, ValueError) as e:
        raise CliError(f"cannot {verb} {args.topic!r}: {e}", EXIT_ERROR) from None
    except MQBrokerError as e:
        raise CliError(f"the broker refused to {verb} {args.topic!r}: {e}", EXIT_ERROR) from None
    except RemotingError as e:
        raise CliError(f"no broker reachable at {namesrv}: {e}", EXIT_ERROR) from None


def run_create(args: argparse.Namespace) -> int:
    if not 1 <= args.queues <= 1024:
        raise CliError(f"--queues {args.queues}: a topic has 1 to 1024 queues", EXIT_ERROR)
    _on_broker(args, "create", lambda admin: admin.create_topic(args.topic, queue_nums=args.queues))
    stdout().write(f"created topic {args.topic} ({args.queues} queues)\n")
    return EXIT_OK


def configure_delete(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic")
    _add_broker(p)


def run_delete(args: argparse.Namespace) -> int:
    _on_broker(args, "delete", lambda admin: admin.delete_topic(args.topic))
    stdout().write(f"deleted topic {args.topic}\n")
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("topic-create", "create a topic on a running broker, or give it more queues (admin under ACL)",
            configure_create, run_create, takes_path=False),
    Command("topic-delete", "delete a topic on a running broker (config, queues, offsets, route)", configure_delete,
            run_delete, takes_path=False),
]
