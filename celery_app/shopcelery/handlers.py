"""Event handlers: the read models of the shop, kept from the ``shop-orders`` topic by every worker of the
app as one RocketMQ consumer group each (queues shared among the workers, offsets in consumerOffset.json)."""

from django.db.models import F

from rmq_eventstore.celery import Event, event_handler
from rmq_eventstore.django.handlers import once


@event_handler("shop-orders", tags="Placed || Paid || Cancelled", group="shop-customer-stats")
@once("shop-customer-stats")
def customer_stats(event: Event) -> None:
    from orders.models import CustomerStats, Order

    data = event.data or {}
    if event.tags == "Placed":
        stats, _ = CustomerStats.objects.get_or_create(customer=data["customer"])
        CustomerStats.objects.filter(pk=stats.pk).update(orders=F("orders") + 1,
                                                         total_cents=F("total_cents") + data["total_cents"],
                                                         last_event_at=event.stored_at)
        return
    order = Order.objects.filter(number=data.get("number")).first()
    if order is None:
        return
    field = "paid" if event.tags == "Paid" else "cancelled"
    CustomerStats.objects.filter(customer=order.customer).update(**{field: F(field) + 1}, last_event_at=event.stored_at)


@event_handler("shop-orders", tags="Placed", group="shop-daily-sales")
@once("shop-daily-sales")
def daily_sales(event: Event) -> None:
    from orders.models import DailySales

    day = event.stored_at.date()
    DailySales.objects.get_or_create(day=day)
    DailySales.objects.filter(day=day).update(orders=F("orders") + 1,
                                              revenue_cents=F("revenue_cents") + (event.data or {}).get("total_cents", 0))
