"""``@event_handler`` and the worker bootstep that runs the handlers (see the package docstring)."""

from __future__ import annotations

import logging
import os
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from celery import Celery, bootsteps

from ..client import ClusterConsumer, MessageExt, resolve_namesrv
from ..common.event import Event
from ..common.filter import MessageFilter
from ..common.topic import validate_group, validate_topic

log = logging.getLogger(__name__)

SETTING_URL = "rmq_eventstore_url"  # app.conf key: the store (file:///path, rocketmq:///path or rmq://host:port)
SETTING_ENABLED = "rmq_eventstore_handlers"  # app.conf key: False turns the bootstep off for a worker


@dataclass
class HandlerSpec:
    """One decorated function: its topic, tag expression and consumer group."""

    func: Callable[[Event], Any]
    topic: str
    tags: str
    group: str
    consume_from: str = "first"
    max_retries: int = 16
    filter: MessageFilter = field(init=False)

    def __post_init__(self) -> None:
        validate_topic(self.topic)
        validate_group(self.group)
        self.filter = MessageFilter(self.tags)

    def matches(self, m: MessageExt) -> bool:
        return m.topic == self.topic and (self.filter.match_all or self.filter.is_matched_by_commit_log(m))


registry: list[HandlerSpec] = []


def event_handler(topic: str, *, tags: str = "*", group: str | None = None, consume_from: str = "first",
                  max_retries: int = 16) -> Callable[[Callable[[Event], Any]], Callable[[Event], Any]]:
    """Register `func(event)` for the messages of `topic` matching `tags` (RocketMQ's tag expression,
    ``"Placed || Paid"``), in consumer group `group` (default: the function's qualified name, so each
    handler keeps its own offsets). ``consume_from="first"`` replays the topic from its first message for
    a new group; ``"last"`` starts at its end. A handler that raises is retried in place (its queue waits)
    `max_retries` times, then its message goes to ``%DLQ%<group>``."""
    def register(func: Callable[[Event], Any]) -> Callable[[Event], Any]:
        name = group or f"{func.__module__}.{func.__qualname__}".replace(".", "_").replace("<", "").replace(">", "")
        spec = HandlerSpec(func, topic, tags, name, consume_from, max_retries)
        registry.append(spec)
        func.event_handler = spec  # type: ignore[attr-defined]
        return func
    return register


def handlers_by_group(specs: list[HandlerSpec] | None = None) -> dict[str, list[HandlerSpec]]:
    out: dict[str, list[HandlerSpec]] = defaultdict(list)
    for spec in registry if specs is None else specs:
        out[spec.group].append(spec)
    return dict(out)


def _subscriptions(specs: list[HandlerSpec]) -> dict[str, str]:
    subs: dict[str, set[str]] = defaultdict(set)
    for s in specs:
        subs[s.topic].add(s.tags.strip() or "*")
    return {t: "*" if "*" in tags else " || ".join(sorted(tags)) for t, tags in subs.items()}


class _ForkGuard:
    """Holds a fork (Celery's prefork pool starting or replacing a child) until no handler runs, and keeps
    handlers from starting while one is under way. A handler inside a database transaction when the process
    forks would leave the child a copy of SQLite's in-process lock table saying the file is locked: the
    child's own connection then finds the database locked for good ("database is locked" in every task)."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cv = threading.Condition()
        self._running = 0
        self._forking = False

    def __enter__(self) -> None:
        with self._cv:
            while self._forking:
                self._cv.wait()
            self._running += 1

    def __exit__(self, *exc: object) -> None:
        with self._cv:
            self._running -= 1
            if not self._running:
                self._cv.notify_all()

    def before_fork(self) -> None:
        with self._cv:
            self._forking = True
            if not self._cv.wait_for(lambda: not self._running, timeout=FORK_WAIT):
                log.warning("forking while %d event handler(s) still run", self._running)

    def after_fork_in_parent(self) -> None:
        with self._cv:
            self._forking = False
            self._cv.notify_all()


FORK_WAIT = 30.0  # s a fork waits for running handlers to finish
_fork_guard = _ForkGuard()
os.register_at_fork(before=_fork_guard.before_fork, after_in_parent=_fork_guard.after_fork_in_parent,
                    after_in_child=_fork_guard._reset)


def _dispatcher(specs: list[HandlerSpec]) -> Callable[[MessageExt], None]:
    def dispatch(m: MessageExt) -> None:
        event = None
        with _fork_guard:
            for spec in specs:
                if spec.matches(m):
                    event = event or Event.from_message(m)
                    spec.func(event)
    return dispatch


def store_url(app: Celery) -> str:
    """The store the handlers read: ``rmq_eventstore_url``, else a ``rocketmq://`` broker URL."""
    url = app.conf.get(SETTING_URL)
    if not url:
        broker = app.conf.broker_url or ""
        if isinstance(broker, str) and broker.startswith(("rocketmq://", "rmq://")):
            url = broker.rstrip("/")
    if not url:
        raise ValueError(f"event handlers need the store: set app.conf.{SETTING_URL} to file:///path/to/store "
                         "or rmq://host:9876 (or use a rocketmq:// broker_url)")
    return url


def start_handlers(app: Celery, specs: list[HandlerSpec] | None = None, **consumer_options: Any) -> list[ClusterConsumer]:
    """Start one `ClusterConsumer` per handler group (what the bootstep does; also for scripts)."""
    namesrv = resolve_namesrv(store_url(app))
    consumers = []
    for group, group_specs in handlers_by_group(specs).items():
        c = ClusterConsumer(namesrv, group, _dispatcher(group_specs), _subscriptions(group_specs),
                            consume_from=group_specs[0].consume_from,
                            max_retries=min(s.max_retries for s in group_specs), **consumer_options)
        consumers.append(c.start())
        log.info("event handler group %s: %s", group, ", ".join(s.func.__qualname__ for s in group_specs))
    return consumers


class EventHandlers(bootsteps.StartStopStep):
    """Worker bootstep: runs the registered ``@event_handler`` groups in the worker's main process while
    the worker runs (off with ``app.conf.rmq_eventstore_handlers = False`` or ``--without-event-handlers``)."""

    label = "rmq_eventstore event handlers"

    def __init__(self, worker: Any, without_event_handlers: bool = False, **kwargs: Any) -> None:
        self.consumers: list[ClusterConsumer] = []
        self.enabled = bool(registry) and not without_event_handlers and \
            worker.app.conf.get(SETTING_ENABLED, True) is not False
        super().__init__(worker, **kwargs)

    def start(self, worker: Any) -> None:
        self.consumers = start_handlers(worker.app)

    def stop(self, worker: Any) -> None:
        for c in self.consumers:
            c.shutdown()
        self.consumers = []

    shutdown = stop


def install(app: Celery) -> Celery:
    """Add the `EventHandlers` bootstep and its ``--without-event-handlers`` option to `app`'s workers."""
    from celery import bootsteps as _bootsteps  # noqa: F401  (celery's registry is imported with it)
    from click import Option

    app.steps["worker"].add(EventHandlers)
    app.user_options["worker"].add(Option(("--without-event-handlers",), is_flag=True, default=False,
                                          help="Do not run this app's @event_handler groups in this worker."))
    return app
