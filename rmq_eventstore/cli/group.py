"""`rmq-eventstore group-lag | group-reset | group-replay`: consumer groups (event handlers) on a running broker.

* `group-lag GROUP [--topic T]`: committed offset against each queue's end (`--json` for machines).
* `group-reset GROUP --topic T (--to-time ISO | --to-offset N) [--force]`: move the group's offsets;
  refused while the group has live members (their positions would be committed over it).
* `group-replay --topic T --handler MODULE:FUNCTION [--from-time ISO] [--to-time ISO] [--tags EXPR]`: call a
  handler for a range of the topic in this process, without touching any group's offsets. A Celery
  `@event_handler` function gets the `Event` it expects, and its topic and tags are the defaults.

The broker is named by `--url` (`file:///path/to/store` finds, or starts, the store's broker process;
`rmq://host:9876` is a name server) or `--namesrv host:port`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
from typing import Any

from ..client import Admin, resolve_namesrv
from ..client.group_ops import GroupOperationError, group_lag, replay, reset_offsets
from ..common.event import Event
from .output import EXIT_ERROR, EXIT_OK, CliError, Command, stdout, table


def _add_broker(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--url", help="file:///path/to/store (its broker is found or started) or rmq://host:9876")
    g.add_argument("--namesrv", help="a name server, host:port")
    p.add_argument("--access-key", default=None)
    p.add_argument("--secret-key", default=None)


def _namesrv(args: argparse.Namespace) -> str:
    try:
        return args.namesrv or resolve_namesrv(args.url)
    except (ValueError, RuntimeError) as e:
        raise CliError(str(e), EXIT_ERROR) from None


def _when(text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CliError(f"{text!r} is not an ISO time such as 2026-11-25T10:00:00+00:00", EXIT_ERROR) from None
    if t.tzinfo is None:
        raise CliError(f"{text!r} has no time zone; add one (e.g. +00:00)", EXIT_ERROR)
    return t


def configure_lag(p: argparse.ArgumentParser) -> None:
    p.add_argument("group")
    p.add_argument("--topic", default=None, help="only this topic (default: every topic the group committed on)")
    p.add_argument("--json", action="store_true")
    _add_broker(p)


def run_lag(args: argparse.Namespace) -> int:
    with Admin(_namesrv(args), access_key=args.access_key, secret_key=args.secret_key) as admin:
        rows = group_lag(admin, args.group, args.topic)
    out = stdout()
    if args.json:
        out.write(json.dumps({"group": args.group, "lag": sum(r.lag for r in rows), "queues": [
            {"topic": r.topic, "queueId": r.queue_id, "brokerOffset": r.broker_offset,
             "consumerOffset": r.consumer_offset, "lag": r.lag} for r in rows]}) + "\n")
        return EXIT_OK
    out.write(f"group {args.group}: lag {sum(r.lag for r in rows)}\n")
    for line in table(["topic", "queue", "broker offset", "consumer offset", "lag"],
                      [(r.topic, r.queue_id, r.broker_offset, r.consumer_offset, r.lag) for r in rows]):
        out.write(line + "\n")
    return EXIT_OK


def configure_reset(p: argparse.ArgumentParser) -> None:
    p.add_argument("group")
    p.add_argument("--topic", required=True)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--to-time", help="ISO time with a zone: the first message stored at or after it")
    g.add_argument("--to-offset", type=int, help="a queue offset (clamped to each queue's range)")
    p.add_argument("--force", action="store_true", help="reset although the group has live members")
    _add_broker(p)


def run_reset(args: argparse.Namespace) -> int:
    try:
        moved = reset_offsets(_namesrv(args), args.group, args.topic, to_time=_when(args.to_time),
                              to_offset=args.to_offset, force=args.force, access_key=args.access_key,
                              secret_key=args.secret_key)
    except GroupOperationError as e:
        raise CliError(str(e), EXIT_ERROR) from None
    out = stdout()
    for line in table(["queue", "old offset", "new offset"], [(q, a, b) for q, (a, b) in sorted(moved.items())]):
        out.write(line + "\n")
    return EXIT_OK


def load_handler(spec: str) -> tuple[Any, dict[str, Any]]:
    """`module:function` → (a callable taking a MessageExt, defaults from a Celery @event_handler)."""
    module, _, name = spec.partition(":")
    if not module or not name:
        raise CliError(f"--handler {spec!r}: give MODULE:FUNCTION", EXIT_ERROR)
    try:
        func = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise CliError(f"--handler {spec!r}: {e}", EXIT_ERROR) from None
    hs = getattr(func, "event_handler", None)
    if hs is None:
        return func, {}
    return (lambda m: func(Event.from_message(m))), {"topic": hs.topic, "tags": hs.tags}


def configure_replay(p: argparse.ArgumentParser) -> None:
    p.add_argument("--handler", required=True, help="MODULE:FUNCTION (a Celery @event_handler, or f(MessageExt))")
    p.add_argument("--topic", default=None, help="default: the @event_handler's topic")
    p.add_argument("--tags", default=None, help="tag expression (default: the handler's, else *)")
    p.add_argument("--from-time", default=None, help="ISO time with a zone (default: the queues' start)")
    p.add_argument("--to-time", default=None, help="ISO time with a zone, exclusive (default: now)")
    _add_broker(p)


def run_replay(args: argparse.Namespace) -> int:
    handler, defaults = load_handler(args.handler)
    topic = args.topic or defaults.get("topic")
    if not topic:
        raise CliError("--topic is needed for a handler that is not an @event_handler", EXIT_ERROR)
    n = replay(_namesrv(args), topic, handler, from_time=_when(args.from_time), to_time=_when(args.to_time),
               tags=args.tags or defaults.get("tags", "*"), access_key=args.access_key, secret_key=args.secret_key)
    stdout().write(f"replayed {n} message(s) of {topic} into {args.handler}\n")
    return EXIT_OK


COMMANDS: list[Command] = [
    Command("group-lag", "a consumer group's lag per queue, on a running broker", configure_lag, run_lag,
            takes_path=False),
    Command("group-reset", "move a consumer group's offsets to a time or an offset (group stopped)", configure_reset,
            run_reset, takes_path=False),
    Command("group-replay", "call a handler for a time range of a topic, offsets untouched", configure_replay,
            run_replay, takes_path=False),
]
