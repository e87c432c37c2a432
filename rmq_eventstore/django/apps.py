"""The app's `AppConfig`: registers the system checks, opens nothing."""

from __future__ import annotations

from django.apps import AppConfig


class RmqEventstoreConfig(AppConfig):
    """`rmq_eventstore.django` in `INSTALLED_APPS`; label ``rmq_eventstore``.

    `ready()` only registers checks and signal receivers: the store is reached lazily, so the
    autoreloader, `migrate` and the test runner never contend for it."""

    name = "rmq_eventstore.django"
    label = "rmq_eventstore"
    verbose_name = "Event store"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, signals  # noqa: F401  (registration)
