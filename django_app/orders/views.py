"""Pages and a JSON API over the same services."""

import json

from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from .models import CustomerStats, DailySales, Notification, Order, OrderEvent
from .services import TRANSITIONS, InvalidTransition, Line, change_order, history, place_order


def order_list(request: HttpRequest) -> HttpResponse:
    page = Paginator(Order.objects.all(), 20).get_page(request.GET.get("page"))
    recent = OrderEvent.objects.order_by("-commit_log_offset")[:10]
    return render(request, "orders/order_list.html", {
        "page": page, "recent": recent, "customers": CustomerStats.objects.all()[:10],
        "days": DailySales.objects.all()[:7]})


@require_http_methods(["POST"])
def order_new(request: HttpRequest) -> HttpResponse:
    try:
        line = Line(request.POST.get("sku", "").strip(), int(request.POST.get("quantity", "1")),
                    int(round(float(request.POST.get("price", "0")) * 100)))
        order = place_order(request.POST.get("customer", "").strip(), [line])
    except ValueError as e:
        return HttpResponse(f"Bad order: {e}", status=400, content_type="text/plain")
    return redirect("order-detail", number=order.number)


def order_detail(request: HttpRequest, number: str) -> HttpResponse:
    order = get_object_or_404(Order, number=number)
    return render(request, "orders/order_detail.html",
                  {"order": order, "events": history(order), "actions": _actions(order)})


def _actions(order: Order) -> list[str]:
    return [a for a, (before, *_rest) in TRANSITIONS.items() if before == order.status]


@require_http_methods(["POST"])
def order_action(request: HttpRequest, number: str, action: str) -> HttpResponse:
    get_object_or_404(Order, number=number)
    try:
        change_order(number, action, int(request.POST.get("expected_version", "-1")))
    except InvalidTransition as e:
        return HttpResponse(str(e), status=400, content_type="text/plain")
    return redirect("order-detail", number=number)


def _order_json(order: Order, events: list[OrderEvent] | None = None) -> dict:
    out = {"number": order.number, "customer": order.customer, "status": order.status,
           "total_cents": order.total_cents, "version": order.version,
           "lines": [{"sku": x.sku, "quantity": x.quantity, "price_cents": x.price_cents} for x in order.lines.all()]}
    if events is not None:
        out["events"] = [{"version": e.version, "type": (e.data or {}).get("type"), "tags": e.tags, "msg_id": e.msg_id,
                          "stored_at": e.stored_at.isoformat()} for e in events]
    return out


@require_http_methods(["GET", "POST"])
def api_orders(request: HttpRequest) -> JsonResponse:
    if request.method == "GET":
        return JsonResponse({"orders": [_order_json(o) for o in Order.objects.prefetch_related("lines")[:100]]})
    try:
        body = json.loads(request.body or b"{}")
        lines = [Line(str(x["sku"]), int(x["quantity"]), int(x["price_cents"])) for x in body.get("lines", [])]
        order = place_order(str(body.get("customer", "")), lines)
    except (ValueError, KeyError, TypeError) as e:
        return JsonResponse({"error": "bad request", "detail": str(e)}, status=400)
    return JsonResponse(_order_json(order), status=201)


def api_order(request: HttpRequest, number: str) -> JsonResponse:
    order = get_object_or_404(Order, number=number)
    return JsonResponse(_order_json(order, history(order)))


@require_http_methods(["POST"])
def api_order_action(request: HttpRequest, number: str, action: str) -> JsonResponse:
    get_object_or_404(Order, number=number)
    try:
        body = json.loads(request.body or b"{}")
        order = change_order(number, action, int(body["expected_version"]))
    except (InvalidTransition, KeyError, ValueError, TypeError) as e:
        return JsonResponse({"error": "bad request", "detail": str(e)}, status=400)
    return JsonResponse(_order_json(order))


def api_read_models(request: HttpRequest) -> JsonResponse:
    """What the worker's event handlers and tasks made of the events (eventually consistent)."""
    return JsonResponse({
        "customers": [{"customer": c.customer, "orders": c.orders, "paid": c.paid, "cancelled": c.cancelled,
                       "total_cents": c.total_cents} for c in CustomerStats.objects.all()],
        "days": [{"day": d.day.isoformat(), "orders": d.orders, "revenue_cents": d.revenue_cents}
                 for d in DailySales.objects.all()],
        "notifications": [{"order": n.order_number, "text": n.text} for n in Notification.objects.order_by("id")],
    })
