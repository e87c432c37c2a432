"""An event-sourced application on the store, with a projection that follows it through a subscription.

    python examples/eventsourcing_shop.py [--store var/es-shop] [--url rmq://127.0.0.1:9876]

* `Shop` is an `eventsourcing` Application of `Order` aggregates, persisted by `rmq_eventstore.eventsourcing`
  (``PERSISTENCE_MODULE``): its events are queue 0 of topic ``ES_Shop``, each order a stream; snapshots go to
  ``ES_Shop--snapshots``.
* `OrderStats` is a projection run by the library's `ProjectionRunner`: it subscribes to the shop (a
  long-polling pull on the broker, woken as soon as an event is stored) and counts orders and revenue in a
  materialised view. The view is kept in memory (``ORDERSTATS_PERSISTENCE_MODULE=eventsourcing.popo``: the
  projection's own prefixed key), so each run rebuilds it from the start of the shop's sequence.

By default the store is opened in this process (``ROCKETMQ_EMBEDDED``): other processes that name the same
``file://`` URL go through this broker while it runs. Run it twice: the second run's orders add to the first's.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from decimal import Decimal
from functools import singledispatchmethod
from pathlib import Path
from uuid import UUID

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from eventsourcing.application import Application  # noqa: E402
from eventsourcing.domain import Aggregate, DomainEvent, event  # noqa: E402
from eventsourcing.persistence import Tracking  # noqa: E402
from eventsourcing.popo import POPOTrackingRecorder  # noqa: E402
from eventsourcing.projection import Projection, ProjectionRunner  # noqa: E402


class Order(Aggregate):
    @event("Placed")
    def __init__(self, customer: str, amount: Decimal) -> None:
        self.customer = customer
        self.amount = amount
        self.paid = False

    @event("Paid")
    def pay(self) -> None:
        self.paid = True


class Shop(Application[UUID]):
    is_snapshotting_enabled = True

    def place(self, customer: str, amount: str) -> UUID:
        order = Order(customer, Decimal(amount))
        self.save(order)
        return order.id

    def pay(self, order_id: UUID) -> None:
        order: Order = self.repository.get(order_id)
        order.pay()
        self.save(order)

    def place_many(self, orders: list[tuple[str, str]]) -> list[UUID]:
        """Several new aggregates in one save: one atomic batch, consecutive notification ids."""
        new = [Order(c, Decimal(a)) for c, a in orders]
        self.save(*new)
        return [o.id for o in new]


class OrderStatsView(POPOTrackingRecorder):
    """The materialised view: counts and revenue, with the position it reached in the shop's sequence."""

    def __init__(self) -> None:
        super().__init__()
        self.placed = 0
        self.paid = 0
        self.revenue = Decimal("0")

    def record(self, tracking: Tracking, placed: int = 0, paid: int = 0, revenue: Decimal = Decimal("0")) -> None:
        with self._database_lock:
            self._assert_tracking_uniqueness(tracking)
            self.placed += placed
            self.paid += paid
            self.revenue += revenue
            self._insert_tracking(tracking)


class OrderStats(Projection[OrderStatsView]):
    topics = (f"{__name__}:Order.Placed", f"{__name__}:Order.Paid")  # filtered by the broker (tags)

    def __init__(self, view: OrderStatsView) -> None:
        super().__init__(view)
        self.amounts: dict[UUID, Decimal] = {}

    @singledispatchmethod
    def process_event(self, domain_event: DomainEvent, tracking: Tracking) -> None:
        self.view.insert_tracking(tracking)

    @process_event.register
    def _(self, domain_event: Order.Placed, tracking: Tracking) -> None:
        self.amounts[domain_event.originator_id] = Decimal(domain_event.amount)  # type: ignore[attr-defined]
        self.view.record(tracking, placed=1)

    @process_event.register
    def _(self, domain_event: Order.Paid, tracking: Tracking) -> None:
        self.view.record(tracking, paid=1, revenue=self.amounts.get(domain_event.originator_id, Decimal("0")))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--store", default="var/es-shop", help="store directory (file:// URL, embedded broker)")
    ap.add_argument("--url", help="rmq://host:port of a name server instead of a local store")
    args = ap.parse_args()
    env = {
        "PERSISTENCE_MODULE": "rmq_eventstore.eventsourcing",
        "ORDERSTATS_PERSISTENCE_MODULE": "eventsourcing.popo",  # the view, by the projection's prefixed key
    }
    if args.url:
        env["ROCKETMQ_URL"] = args.url
    else:
        store = os.path.abspath(args.store)
        env.update({"ROCKETMQ_URL": "file://" + store, "ROCKETMQ_EMBEDDED": "y",
                    # small files for a demo (the default preallocates a 1 GiB commitlog file)
                    "ROCKETMQ_BROKER_OPTIONS": json.dumps({"mapped_file_size_commit_log": 16 << 20,
                                                           "mapped_file_size_consume_queue": 600_000})})
    with ProjectionRunner(application_class=Shop, projection_class=OrderStats, view_class=OrderStatsView,
                          env=env) as runner:
        shop: Shop = runner.app
        print(f"shop events on topic {shop.recorder.topic}, store {env['ROCKETMQ_URL']}")  # type: ignore[attr-defined]
        ada = shop.place("ada", "12.50")
        ids = shop.place_many([("bob", "3.00"), ("cy", "40.00")])
        shop.pay(ada)
        shop.pay(ids[1])
        shop.take_snapshot(ada)  # on topic ES_Shop--snapshots; the next get starts from it
        last = shop.recorder.max_notification_id()
        runner.wait(last, timeout=10)
        view = runner.view
        print(f"notifications: {last}; the projection reached {view.max_tracking_id(shop.name)}")
        print(f"orders placed {view.placed}, paid {view.paid}, revenue {view.revenue}")
        for n in shop.notification_log.select(start=max(1, (last or 1) - 4), limit=5):
            print(f"  #{n.id} {n.topic.rsplit(':', 1)[-1]:<13} order {n.originator_id} v{n.originator_version}")
        order: Order = shop.repository.get(ada)
        print(f"order {ada}: {order.customer} {order.amount} paid={order.paid} (version {order.version})")


if __name__ == "__main__":
    main()
