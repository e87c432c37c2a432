"""Views of the tests: an order placed with its event in one transaction, and a conditional append."""

import json

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from .models import Order, OrderEvent


@csrf_exempt
def place_order(request: HttpRequest, number: str) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(number=number)
        event = OrderEvent.objects.append({"number": number}, keys=number, tags="Placed", stream=f"order-{number}",
                                          expected_version=0)
    return JsonResponse({"order": order.pk, "event": event.msg_id}, status=201)


@csrf_exempt
def append_to_stream(request: HttpRequest, stream: str) -> JsonResponse:
    body = json.loads(request.body or b"{}")
    with transaction.atomic():
        event = OrderEvent.objects.append(body.get("data"), stream=stream, expected_version=body.get("expected"))
    return JsonResponse({"event": event.msg_id, "version": event.version}, status=201)


# Django REST framework's generic views over an event model
from rest_framework import generics, pagination, serializers  # noqa: E402


class OrderEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = OrderEvent
        fields = ["msg_id", "stream", "version", "tags", "keys", "data", "stored_at", "queue_id", "queue_offset"]


class ByOffsetCursor(pagination.CursorPagination):
    ordering = "-commit_log_offset"
    page_size = 7


class EventList(generics.ListAPIView):
    queryset = OrderEvent.objects.all()
    serializer_class = OrderEventSerializer
    pagination_class = pagination.LimitOffsetPagination


class EventCursorList(EventList):
    pagination_class = ByOffsetCursor


class EventDetail(generics.RetrieveAPIView):
    queryset = OrderEvent.objects.all()
    serializer_class = OrderEventSerializer
