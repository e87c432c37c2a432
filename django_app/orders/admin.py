from django.contrib import admin

from rmq_eventstore.django.admin import EventModelAdmin

from .models import Order, OrderEvent, OrderLine


class OrderLineInline(admin.TabularInline):
    model = OrderLine
    extra = 0


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):
    list_display = ("number", "customer", "status", "total_cents", "version", "created_at")
    list_filter = ("status",)
    search_fields = ("number", "customer")
    inlines = [OrderLineInline]


@admin.register(OrderEvent)
class OrderEventAdmin(EventModelAdmin):
    list_tags = ("Placed", "Paid", "Shipped", "Cancelled")
