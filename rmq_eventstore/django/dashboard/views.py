"""The dashboard's views (mounted by `DashboardAdmin.get_urls`, which checks staff first). Each takes the
request and the `DashboardAdmin`, reads the alias's brokers (``data``) and renders a template that extends
``admin/base_site.html``. A broker that cannot be reached is an error on the page, not a 500."""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.template.response import TemplateResponse

from ...client import ExtensionNotSupportedError
from ...client.remoting_client import MQBrokerError, RemotingError
from ..conf import DEFAULT_ALIAS, configured_aliases
from ..connection import EventStore, stores
from . import data

log = logging.getLogger(__name__)

STORE_ERRORS = (MQBrokerError, RemotingError, OSError, LookupError, ExtensionNotSupportedError)
PAGES = (("changelist", "Overview"), ("topics", "Topics"), ("groups", "Consumer groups"), ("lookup", "Lookup"),
         ("charts", "Charts"))


def _store(request: HttpRequest) -> EventStore:
    alias = request.GET.get("alias") or DEFAULT_ALIAS
    if alias not in configured_aliases():
        raise Http404(f"no store alias {alias!r}")
    try:
        return stores[alias]
    except ImproperlyConfigured as e:
        raise Http404(str(e)) from None


def _render(request: HttpRequest, model_admin: Any, template: str, page: str, title: str,
            store: EventStore, **context: Any) -> TemplateResponse:
    opts = model_admin.opts
    ctx = {
        **model_admin.admin_site.each_context(request),
        "opts": opts, "title": title, "page": page, "pages": PAGES, "alias": store.alias,
        "aliases": list(configured_aliases()), "store_url": store.settings.url,
        **context,
    }
    return TemplateResponse(request, f"rmq_eventstore/dashboard/{template}", ctx)


def _failure(e: Exception) -> str:
    log.warning("the dashboard could not read the store: %s", e)
    return f"{type(e).__name__}: {e}"


def overview(request: HttpRequest, model_admin: Any) -> HttpResponse:
    store = _store(request)
    brokers, error = [], ""
    try:
        brokers = data.broker_health(store)
    except STORE_ERRORS as e:
        error = _failure(e)
    return _render(request, model_admin, "overview.html", "changelist", "Event store: health", store,
                   brokers=brokers, error=error)


def _table_page(request: HttpRequest, model_admin: Any, rows_of: Any, template: str, tab: str,
                title: str) -> HttpResponse:
    """A page listing `rows_of(store, show_system)` (system topics and groups only with ?system=1)."""
    store = _store(request)
    show_system = request.GET.get("system") == "1"
    rows, error = [], ""
    try:
        rows = rows_of(store, show_system)
    except STORE_ERRORS as e:
        error = _failure(e)
    return _render(request, model_admin, template, tab, title, store, rows=rows, error=error,
                   show_system=show_system)


def topics(request: HttpRequest, model_admin: Any) -> HttpResponse:
    return _table_page(request, model_admin, data.topic_rows, "topics.html", "topics", "Event store: topics")


def groups(request: HttpRequest, model_admin: Any) -> HttpResponse:
    return _table_page(request, model_admin, data.group_rows, "groups.html", "groups",
                       "Event store: consumer groups")


def lookup(request: HttpRequest, model_admin: Any) -> HttpResponse:
    store = _store(request)
    kind = request.GET.get("kind") or "key"
    value = request.GET.get("q", "")
    topic = request.GET.get("topic", "").strip()
    results: list[Any] = []
    error = ""
    searched = bool(value.strip())
    topic_choices: list[str] = []
    try:
        topic_choices = sorted(t for t in store.admin.topic_list() if not data.is_system_topic(t))
    except STORE_ERRORS as e:
        error = _failure(e)
    if searched and not error:
        try:
            results = data.lookup(store, kind, value, topic)
        except ValueError as e:
            error = str(e)
        except STORE_ERRORS as e:
            error = _failure(e)
    return _render(request, model_admin, "lookup.html", "lookup", "Event store: lookup", store,
                   kind=kind, q=value, topic=topic, topic_choices=topic_choices, results=results,
                   searched=searched, error=error,
                   kinds=(("key", "key"), ("msgid", "message id"), ("offset", "commitlog offset")))


def charts(request: HttpRequest, model_admin: Any) -> HttpResponse:
    store = _store(request)
    opts = model_admin.opts
    return _render(request, model_admin, "charts.html", "charts", "Event store: throughput and lag", store,
                   data_url_name=f"admin:{opts.app_label}_{opts.model_name}_chart_data")


def chart_data(request: HttpRequest, model_admin: Any) -> JsonResponse:
    store = _store(request)
    try:
        return JsonResponse(data.chart_series(store))
    except STORE_ERRORS as e:
        return JsonResponse({"alias": store.alias, "error": _failure(e), "brokers": []}, status=503)
