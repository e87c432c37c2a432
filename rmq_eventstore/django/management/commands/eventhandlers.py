"""`manage.py eventhandlers lag | reset | replay`: event-handler (consumer group) operations on the store of
an ``RMQ_EVENTSTORE`` alias, through the library's `rmq_eventstore.client.group_ops` (as `rmq-eventstore
group-lag | group-reset | group-replay` does)."""

from __future__ import annotations

import datetime
import importlib
import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from ....client import Admin
from ....client.group_ops import GroupOperationError, group_lag, replay, reset_offsets
from ....common.event import Event
from ...connection import stores


def _when(text: str | None) -> datetime.datetime | None:
    if text is None:
        return None
    try:
        t = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise CommandError(f"{text!r} is not an ISO time such as 2026-11-25T10:00:00+00:00") from None
    if t.tzinfo is None:
        raise CommandError(f"{text!r} has no time zone; add one (e.g. +00:00)")
    return t


class Command(BaseCommand):
    help = "Consumer groups of event handlers: lag per queue, reset offsets (group stopped), replay a range."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--store", default="default", help="the RMQ_EVENTSTORE alias (default: default)")
        sub = parser.add_subparsers(dest="action", required=True)
        lag = sub.add_parser("lag", help="committed offsets against each queue's end")
        lag.add_argument("group")
        lag.add_argument("--topic")
        lag.add_argument("--json", action="store_true")
        reset = sub.add_parser("reset", help="move a group's offsets to a time or an offset")
        reset.add_argument("group")
        reset.add_argument("--topic", required=True)
        g = reset.add_mutually_exclusive_group(required=True)
        g.add_argument("--to-time")
        g.add_argument("--to-offset", type=int)
        reset.add_argument("--force", action="store_true", help="even though the group has live members")
        rp = sub.add_parser("replay", help="call a handler for a time range of a topic (offsets untouched)")
        rp.add_argument("--handler", required=True, help="MODULE:FUNCTION (an @event_handler, or f(message))")
        rp.add_argument("--topic")
        rp.add_argument("--tags")
        rp.add_argument("--from-time")
        rp.add_argument("--to-time")

    def handle(self, *args: Any, **o: Any) -> None:
        store = stores[o["store"]]
        creds = {"access_key": store.options.get("ACCESS_KEY"), "secret_key": store.options.get("SECRET_KEY")}
        namesrv = store.namesrv
        if o["action"] == "lag":
            with Admin(namesrv, **creds) as admin:
                rows = group_lag(admin, o["group"], o.get("topic"))
            total = sum(r.lag for r in rows)
            if o["json"]:
                self.stdout.write(json.dumps({"group": o["group"], "lag": total, "queues": [
                    {"topic": r.topic, "queueId": r.queue_id, "brokerOffset": r.broker_offset,
                     "consumerOffset": r.consumer_offset, "lag": r.lag} for r in rows]}))
                return
            self.stdout.write(self.style.MIGRATE_HEADING(f"group {o['group']}: lag {total}"))
            if o["verbosity"] >= 1:
                for r in rows:
                    self.stdout.write(f"  {r.topic} q{r.queue_id}: {r.consumer_offset} of {r.broker_offset} "
                                      f"(lag {r.lag})")
        elif o["action"] == "reset":
            try:
                moved = reset_offsets(namesrv, o["group"], o["topic"], to_time=_when(o.get("to_time")),
                                      to_offset=o.get("to_offset"), force=o["force"], **creds)
            except GroupOperationError as e:
                raise CommandError(str(e)) from None
            for q, (old, new) in sorted(moved.items()):
                self.stdout.write(f"  {o['topic']} q{q}: {old} -> {new}")
            self.stdout.write(self.style.SUCCESS(f"reset {o['group']} on {len(moved)} queue(s)"))
        else:
            module, _, name = o["handler"].partition(":")
            try:
                func = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError, ValueError) as e:
                raise CommandError(f"--handler {o['handler']!r}: {e}") from None
            spec = getattr(func, "event_handler", None)
            topic = o.get("topic") or (spec.topic if spec else None)
            if not topic:
                raise CommandError("--topic is needed for a handler that is not an @event_handler")
            call = (lambda m: func(Event.from_message(m))) if spec else func
            n = replay(namesrv, topic, call, from_time=_when(o.get("from_time")), to_time=_when(o.get("to_time")),
                       tags=o.get("tags") or (spec.tags if spec else "*"), **creds)
            self.stdout.write(self.style.SUCCESS(f"replayed {n} message(s) of {topic} into {o['handler']}"))
