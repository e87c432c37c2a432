"""The shop's rows and its events. An order's changes are rows here and events on the ``shop-orders``
topic, one stream per order, appended in the same database transaction (``services``)."""

from django.db import models

from rmq_eventstore.django.models import EventModel


class Order(models.Model):
    PLACED, PAID, SHIPPED, CANCELLED = "placed", "paid", "shipped", "cancelled"
    STATUSES = [(PLACED, "placed"), (PAID, "paid"), (SHIPPED, "shipped"), (CANCELLED, "cancelled")]

    number = models.CharField(max_length=32, unique=True)
    customer = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=STATUSES, default=PLACED)
    total_cents = models.BigIntegerField(default=0)
    version = models.BigIntegerField(default=0, help_text="the version of the order's event stream")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.number

    @property
    def stream(self) -> str:
        return f"order-{self.number}"


class OrderLine(models.Model):
    order = models.ForeignKey(Order, related_name="lines", on_delete=models.CASCADE)
    sku = models.CharField(max_length=32)
    quantity = models.PositiveIntegerField()
    price_cents = models.BigIntegerField()


class OrderEvent(EventModel):
    """Events of every order: tags Placed, Paid, Shipped, Cancelled; the stream is ``order-<number>``."""

    topic = "shop-orders"


class CustomerStats(models.Model):
    """A read model kept by the Celery worker's event handler from the order events (celery_app/)."""

    customer = models.CharField(max_length=100, unique=True)
    orders = models.PositiveIntegerField(default=0)
    paid = models.PositiveIntegerField(default=0)
    cancelled = models.PositiveIntegerField(default=0)
    total_cents = models.BigIntegerField(default=0)
    last_event_at = models.DateTimeField(null=True)

    class Meta:
        ordering = ["-total_cents"]
        verbose_name_plural = "customer stats"


class DailySales(models.Model):
    """Orders and revenue per day, kept by an event handler and summarised by a beat task."""

    day = models.DateField(unique=True)
    orders = models.PositiveIntegerField(default=0)
    revenue_cents = models.BigIntegerField(default=0)

    class Meta:
        ordering = ["-day"]
        verbose_name_plural = "daily sales"


class Notification(models.Model):
    """What the worker's task 'sent' (the reference project writes notifications instead of e-mails)."""

    order_number = models.CharField(max_length=32)
    text = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)
