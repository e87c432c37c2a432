"""`EventModelAdmin`: Django's admin on event models, read-only.

``admin.site.register(OrderEvent, EventModelAdmin)`` gives a changelist (newest first, filters on queue,
store time and tags, search by key, message id or stream through the index, pagination with counts) and a
detail page with the decoded body. Nothing can be added, changed or deleted: the log is append-only.
"""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.db.models import Q
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext_lazy as _

from .query import EventQuerySet


class QueueFilter(admin.SimpleListFilter):
    """Events of one queue (the choices are the topic's queues)."""

    title = _("queue")
    parameter_name = "queue_id"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        model = model_admin.model
        try:
            ids = model.objects.all().event_store.queue_ids(model.topic)
        except Exception:  # the store is unreachable: the changelist says so itself
            ids = []
        return [(str(q), f"queue {q}") for q in ids]

    def queryset(self, request: HttpRequest, queryset: EventQuerySet) -> EventQuerySet:
        value = self.value()
        if value is None:
            return queryset
        try:
            return queryset.filter(queue_id=int(value))
        except ValueError:
            return queryset.none()


class TagFilter(admin.SimpleListFilter):
    """Events with one tag (the model's ``tag_set``, or the ``list_tags`` of the admin)."""

    title = _("tag")
    parameter_name = "tags"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        tags = getattr(model_admin, "list_tags", None) or getattr(model_admin.model, "tag_set", None) or ()
        return [(t, t) for t in sorted(tags)]

    def queryset(self, request: HttpRequest, queryset: EventQuerySet) -> EventQuerySet:
        return queryset if self.value() is None else queryset.filter(tags=self.value())


class EventModelAdmin(admin.ModelAdmin):
    """Read-only admin for an `EventModel` (see the module docstring). ``list_tags`` names the tags offered
    as a filter when the model has no ``tag_set``."""

    list_display = ("msg_id", "stored_at", "tags", "keys", "stream", "version", "queue_id", "queue_offset")
    list_filter: tuple[Any, ...] = (QueueFilter, TagFilter, ("stored_at", admin.DateFieldListFilter))
    ordering = ("-commit_log_offset",)
    search_help_text = _("an exact key, message id or stream id (looked up in the index)")
    search_fields = ("keys",)  # any non-empty value turns the search box on; the lookup is ours, below
    list_per_page = 50
    show_facets = admin.ShowFacets.NEVER
    actions = None
    list_tags: tuple[str, ...] = ()
    readonly_fields = ("msg_id", "queue_id", "queue_offset", "commit_log_offset", "born_at", "stored_at", "keys",
                       "tags", "stream", "version", "decoded_data", "body_text", "properties_table")
    fields = readonly_fields

    def get_search_results(self, request: HttpRequest, queryset: EventQuerySet,
                           search_term: str) -> tuple[EventQuerySet, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(keys=term) | Q(msg_id=term) | Q(stream=term)), False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description=_("data"))
    def decoded_data(self, obj: Any) -> str:
        if obj.data is None:
            return "—"
        return format_html("<pre>{}</pre>", json.dumps(obj.data, indent=2, ensure_ascii=False, default=str))

    @admin.display(description=_("body"))
    def body_text(self, obj: Any) -> str:
        body = bytes(obj.body or b"")
        text = body[:4096].decode("utf-8", "replace")
        more = f" … ({len(body)} bytes)" if len(body) > 4096 else ""
        return format_html("<pre>{}{}</pre>", text, more)

    @admin.display(description=_("properties"))
    def properties_table(self, obj: Any) -> str:
        if not obj.properties:
            return "—"
        return format_html("<pre>{}</pre>", json.dumps(obj.properties, indent=2, ensure_ascii=False))


def _register_dashboard() -> None:
    """The staff dashboard on the default admin site (see ``dashboard.admin``); another site registers
    ``Dashboard`` with ``DashboardAdmin`` itself."""
    from .dashboard.admin import DashboardAdmin
    from .marker import Dashboard

    if not admin.site.is_registered(Dashboard):
        admin.site.register(Dashboard, DashboardAdmin)


_register_dashboard()
