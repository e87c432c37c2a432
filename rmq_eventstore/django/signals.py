"""Signals of the Django face, and the receiver that drops cached store connections when
``RMQ_EVENTSTORE`` changes (``override_settings``, pytest-django's ``settings`` fixture)."""

from __future__ import annotations

from typing import Any

from django.core.signals import setting_changed
from django.dispatch import Signal, receiver

#: Sent after an event is visible on its topic: ``sender`` = the event model, ``instance`` = the event.
event_appended = Signal()


@receiver(setting_changed)
def _store_setting_changed(setting: str, **kwargs: Any) -> None:
    if setting == "RMQ_EVENTSTORE":
        from .connection import stores

        stores.close_all()
        stores.reset()
