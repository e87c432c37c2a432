from django.contrib import admin

from rmq_eventstore.django.admin import EventModelAdmin

from .models import OrderEvent

admin.site.register(OrderEvent, EventModelAdmin)
