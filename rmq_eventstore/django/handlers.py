"""Idempotent event handlers on the database: ``@once("order-read-model")``.

Event handlers run at least once (a crash or a rebalance can deliver an event again). Wrapped with `once`,
a handler runs inside ``transaction.atomic()`` together with the insert of a `HandledEvent` row keyed by
(group, message id); an event whose row exists is skipped, and a handler that raises leaves no row. So its
database writes happen exactly once per event::

    @event_handler("orders", tags="Placed", group="customer-stats")
    @once("customer-stats")
    def count_order(event): CustomerStats.objects.filter(...).update(orders=F("orders") + 1)
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import IntegrityError, transaction

from .marker import HandledEvent

F = TypeVar("F", bound=Callable[..., Any])


def message_id(event: Any) -> str:
    """The id `once` keys on: ``event.msg_id`` (an `Event`, an event model) or a MessageExt's UNIQ_KEY."""
    uniq = getattr(event, "uniq_key", None)
    return str(uniq or event.msg_id)


def once(group: str, *, using: str | None = None) -> Callable[[F], F]:
    """Run the decorated ``handler(event, ...)`` at most once per (group, event) with respect to the database
    `using` (see the module docstring). Returns the handler's result, or None for a skipped duplicate."""
    if not group:
        raise ValueError("once() needs the handler's group name")

    def wrap(func: F) -> F:
        @functools.wraps(func)
        def handler(event: Any, *args: Any, **kwargs: Any) -> Any:
            key = message_id(event)
            with transaction.atomic(using=using):
                try:
                    with transaction.atomic(using=using):  # a savepoint: the conflict leaves the outer usable
                        HandledEvent.objects.using(using).create(group=group, msg_id=key)
                except IntegrityError:
                    return None  # handled before: its effects are committed already
                return func(event, *args, **kwargs)
        return handler  # type: ignore[return-value]
    return wrap


def already_handled(group: str, event: Any, *, using: str | None = None) -> bool:
    return HandledEvent.objects.using(using).filter(group=group, msg_id=message_id(event)).exists()
