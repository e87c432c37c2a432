"""The reference Celery app of the shop (django_app/): tasks the web app calls, event handlers that keep its
read models from the order events, a beat schedule; its broker is the store, through rmq_eventstore.kombu."""

from .app import app

__all__ = ["app"]
