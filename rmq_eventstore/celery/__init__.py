"""The Celery face: event handlers run by workers (``@event_handler``), as RocketMQ clustering consumers.

Install the bootstep on your app (``rmq_eventstore.celery.install(app)``) and decorate functions::

    @event_handler("orders", tags="Placed || Paid", group="order-read-model")
    def project(event): ...

Every worker of the app then runs each group as one member of a RocketMQ consumer group: the topic's queues
are divided among the live workers, rebalanced when one joins or dies, read in order, and their offsets
committed to the broker after handling (consumerOffset.json), so a restarted worker resumes where the group
stopped. The Celery transport itself is ``rmq_eventstore.kombu``.
"""

from .handlers import Event, EventHandlers, HandlerSpec, event_handler, handlers_by_group, install, registry

__all__ = ["Event", "EventHandlers", "HandlerSpec", "event_handler", "handlers_by_group", "install", "registry"]
