"""Event models of the tests, and an ordinary SQL model with the same fields (differential tests)."""

from django.db import models

from rmq_eventstore.django.models import EventModel


class OrderEvent(EventModel):
    topic = "orders"


class PlacedEvent(EventModel):
    topic = "orders"
    tag_set = {"Placed"}


class AuditEvent(EventModel):
    topic = "audit"


class Order(models.Model):
    """A business row written in the same transaction as its events."""

    number = models.CharField(max_length=32, unique=True)
    status = models.CharField(max_length=32, default="placed")


class SqlEvent(models.Model):
    """The same rows as an event topic, in SQL: the reference for differential tests."""

    msg_id = models.CharField(max_length=64, primary_key=True)
    queue_id = models.IntegerField()
    queue_offset = models.BigIntegerField()
    commit_log_offset = models.BigIntegerField(unique=True)
    born_at = models.DateTimeField()
    stored_at = models.DateTimeField()
    keys = models.CharField(max_length=4096, blank=True, default="")
    tags = models.CharField(max_length=255, blank=True, null=True)
    stream = models.CharField(max_length=255, blank=True, null=True)
    version = models.BigIntegerField(blank=True, null=True)

    class Meta:
        ordering = ["commit_log_offset"]


class OrderLine(models.Model):
    """A row with a foreign key: a dangling one makes the database commit fail (the constraint is deferred)."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
    sku = models.CharField(max_length=32)
