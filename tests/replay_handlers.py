"""Handlers that tests/test_group_ops.py replays into (by MODULE:FUNCTION)."""

import json

from rmq_eventstore.celery import event_handler

seen: list = []


def collect(message) -> None:
    seen.append(("message", json.loads(message.body)["n"]))


@event_handler("ops-events", tags="Even", group="ops-even")
def even(event) -> None:
    seen.append(("event", event.data["n"], event.tags))
