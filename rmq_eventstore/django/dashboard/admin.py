"""`DashboardAdmin`: the staff dashboard as admin views of the table-less `Dashboard` model.

Registering a `ModelAdmin` whose `get_urls()` returns the dashboard's views is Django's documented way to
add pages to an admin site (`ModelAdmin.get_urls`, "Adding views to admin sites"): the views live under the
site's URLs (``/admin/rmq_eventstore/dashboard/...``), `AdminSite.admin_view` gives them the login redirect,
staff check and never-cache headers, the admin index lists "Dashboard" under "Event store" with no template
override or custom `AdminSite`, and `admin/base_site.html` gives them the admin's look. The pages:

* ``""`` overview: store health per broker (checkpoint times, dispatch backlog, disk use against the
  watermarks, commitlog offsets, put counters);
* ``topics/``: every topic's queues (min/max offsets, message counts, last store time);
* ``groups/``: consumer groups with their lag per queue;
* ``lookup/``: a message by key, message id or commitlog offset, decoded by the topic's event model;
* ``charts/`` and ``charts/data.json``: throughput and lag over the last hour, from the broker's history.

Every page takes ``?alias=`` (an alias of ``RMQ_EVENTSTORE``, default ``default``).
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.urls import path

from . import views


class DashboardAdmin(admin.ModelAdmin):
    """The dashboard's entry in an admin site: visible to active staff, nothing to add, change or delete."""

    def has_module_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.is_active and request.user.is_staff)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        info = self.opts.app_label, self.opts.model_name
        pages = [("", views.overview, "changelist"), ("topics/", views.topics, "topics"),
                 ("groups/", views.groups, "groups"), ("lookup/", views.lookup, "lookup"),
                 ("charts/", views.charts, "charts"), ("charts/data.json", views.chart_data, "chart_data")]
        return [path(route, self.admin_site.admin_view(self._bind(view)), name=f"{info[0]}_{info[1]}_{name}")
                for route, view, name in pages]

    def _bind(self, view: Any) -> Any:
        def bound(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            if not self.has_view_permission(request):
                raise PermissionDenied
            request.current_app = self.admin_site.name
            return view(request, self, *args, **kwargs)

        bound.__name__ = bound.__qualname__ = getattr(view, "__name__", "view")
        return bound
