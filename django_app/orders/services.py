"""What the shop does: each change writes its rows and appends its event in one database transaction."""

import secrets
from dataclasses import dataclass

from django.db import transaction

from .models import Order, OrderEvent, OrderLine


class InvalidTransition(ValueError):
    """The order is not in a state that allows this action."""


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    price_cents: int


def place_order(customer: str, lines: list[Line]) -> Order:
    if not customer or not lines:
        raise ValueError("an order needs a customer and at least one line")
    if any(line.quantity <= 0 or line.price_cents < 0 for line in lines):
        raise ValueError("quantities must be positive and prices not negative")
    number = "O-" + secrets.token_hex(4).upper()
    total = sum(line.quantity * line.price_cents for line in lines)
    with transaction.atomic():
        order = Order.objects.create(number=number, customer=customer, total_cents=total)
        OrderLine.objects.bulk_create(OrderLine(order=order, sku=x.sku, quantity=x.quantity, price_cents=x.price_cents)
                                      for x in lines)
        event = OrderEvent.objects.append(
            {"type": "OrderPlaced", "number": number, "customer": customer, "total_cents": total,
             "lines": [x.__dict__ for x in lines]},
            keys=[number, f"customer-{customer}"], tags="Placed", stream=order.stream, expected_version=0)
        order.version = event.version
        order.save(update_fields=["version"])
        transaction.on_commit(lambda: _notify(number))
    return order


def _notify(number: str) -> None:
    """Ask the worker to confirm the order (a Celery task through the store's broker)."""
    from shopcelery.tasks import notify_order_placed

    notify_order_placed.delay(number)


TRANSITIONS = {
    "pay": (Order.PLACED, Order.PAID, "Paid", "OrderPaid"),
    "ship": (Order.PAID, Order.SHIPPED, "Shipped", "OrderShipped"),
    "cancel": (Order.PLACED, Order.CANCELLED, "Cancelled", "OrderCancelled"),
}


def change_order(number: str, action: str, expected_version: int) -> Order:
    """Apply `action` if the order is still at `expected_version` (else `ConcurrencyError`: HTTP 409)."""
    if action not in TRANSITIONS:
        raise InvalidTransition(f"unknown action {action!r}; one of {', '.join(TRANSITIONS)}")
    before, after, tag, kind = TRANSITIONS[action]
    with transaction.atomic():
        order = Order.objects.select_for_update().get(number=number)
        if order.status != before:
            raise InvalidTransition(f"order {number} is {order.status}; {action} needs {before}")
        event = OrderEvent.objects.append({"type": kind, "number": number}, keys=number, tags=tag,
                                          stream=order.stream, expected_version=expected_version)
        order.status = after
        order.version = event.version
        order.save(update_fields=["status", "version"])
    return order


def history(order: Order) -> list[OrderEvent]:
    return list(OrderEvent.objects.filter(stream=order.stream).order_by("version"))
