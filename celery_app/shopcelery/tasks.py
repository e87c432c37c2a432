"""Tasks the web app calls (``notify_order_placed.delay_on_commit(number)``) and the beat task."""

import datetime

from celery import shared_task
from django.db.models import Sum
from django.utils import timezone


@shared_task(acks_late=True)
def notify_order_placed(number: str) -> str:
    """'Send' the order confirmation (a Notification row); idempotent per order."""
    from orders.models import Notification, Order

    order = Order.objects.get(number=number)
    text = f"Thank you {order.customer}: order {number}, {order.total_cents / 100:.2f} in total."
    Notification.objects.get_or_create(order_number=number, defaults={"text": text})
    return text


@shared_task
def summarize_sales(days: int = 7) -> dict:
    """Beat: the last days' orders and revenue from the DailySales read model (logged and returned)."""
    from orders.models import DailySales

    since = timezone.now().date() - datetime.timedelta(days=days)
    agg = DailySales.objects.filter(day__gte=since).aggregate(orders=Sum("orders"), revenue=Sum("revenue_cents"))
    return {"since": since.isoformat(), "orders": agg["orders"] or 0, "revenue_cents": agg["revenue"] or 0}


@shared_task
def add(x: int, y: int) -> int:
    return x + y
