"""A tiny order service with SQLAlchemy and the event store, no web framework: plain WSGI (wsgiref).

Each request runs in one database transaction; the events it appends commit or roll back with it:

    POST /orders                 {"number": "A-1", "total": 42}  -> 201, the row and OrderPlaced
    POST /orders/A-1/pay         {"expected_version": 1}         -> 200, or 409 if someone else got there first
    POST /orders/A-1/cancel      {"reason": "..."}               -> 422 after payment: the transaction rolls back,
                                                                     its OrderCancelled never appears
    GET  /orders/A-1/events                                      -> the order's stream, in version order

    python examples/sqlalchemy_orders.py --demo          # runs a few requests in-process and prints them
    python examples/sqlalchemy_orders.py --port 8000     # serves on 127.0.0.1:8000

The store is ``file://<dir>/store``: the first process starts the broker that owns it (shared by any
number of service processes, which are then members of one producer group and settle each other's
transactions if one dies between its database commit and the event's commit).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

from sqlalchemy import String, create_engine, event, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from rmq_eventstore.sqlalchemy import ConcurrencyError, EventStore, EventTransactionMixin

TOPIC = "Orders"


class Base(DeclarativeBase):
    pass


class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(primary_key=True)
    number: Mapped[str] = mapped_column(String(40), unique=True)
    total: Mapped[int]
    status: Mapped[str] = mapped_column(String(20), default="placed")


class EventMarker(EventTransactionMixin, Base):
    """The store's marker table, owned by this application's metadata (and so its migrations)."""

    __tablename__ = "event_markers"


class HttpError(Exception):
    def __init__(self, status: str, body: dict[str, Any]) -> None:
        super().__init__(status)
        self.status, self.body = status, body


class OrderService:
    def __init__(self, sessions: sessionmaker[Session], store: EventStore) -> None:
        self.sessions = sessions
        self.store = store

    def place(self, session: Session, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        number = str(body["number"])
        session.add(Order(number=number, total=int(body.get("total", 0))))
        e = self.store.append(session, TOPIC, {"type": "OrderPlaced", "number": number, "total": body.get("total")},
                              tags="OrderPlaced", stream=f"order-{number}", expected_version=0)
        return "201 Created", {"number": number, "version": e.version}

    def pay(self, session: Session, number: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        order = self._order(session, number)
        order.status = "paid"
        e = self.store.append(session, TOPIC, {"type": "OrderPaid", "number": number}, tags="OrderPaid",
                              stream=f"order-{number}", expected_version=body.get("expected_version"))
        return "200 OK", {"number": number, "version": e.version}

    def cancel(self, session: Session, number: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        order = self._order(session, number)
        self.store.append(session, TOPIC, {"type": "OrderCancelled", "reason": body.get("reason")},
                          tags="OrderCancelled", stream=f"order-{number}")
        if order.status == "paid":  # raised after the append: the transaction and its event roll back
            raise HttpError("422 Unprocessable Entity", {"error": "already paid"})
        order.status = "cancelled"
        return "200 OK", {"number": number}

    def events(self, number: str) -> tuple[str, dict[str, Any]]:
        return "200 OK", {"events": [{"version": e.version, **e.data} for e in
                                     self.store.read_stream(TOPIC, f"order-{number}")]}

    @staticmethod
    def _order(session: Session, number: str) -> Order:
        order = session.scalar(select(Order).where(Order.number == number))
        if order is None:
            raise HttpError("404 Not Found", {"error": f"no order {number}"})
        return order

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "/")
        try:
            size = int(environ.get("CONTENT_LENGTH") or 0)
            body = json.loads(environ["wsgi.input"].read(size) or b"{}") if size else {}
            if method == "GET" and (m := re.fullmatch(r"/orders/([\w-]+)/events", path)):
                status, out = self.events(m[1])
            else:
                with self.sessions.begin() as session:  # one transaction per request
                    if method == "POST" and path == "/orders":
                        status, out = self.place(session, body)
                    elif method == "POST" and (m := re.fullmatch(r"/orders/([\w-]+)/(pay|cancel)", path)):
                        status, out = getattr(self, m[2])(session, m[1], body)
                    else:
                        raise HttpError("404 Not Found", {"error": "no such route"})
        except HttpError as e:
            status, out = e.status, e.body
        except ConcurrencyError as e:
            status, out = "409 Conflict", {"error": "conflict", "stream": e.stream,
                                           "expected_version": e.expected_version,
                                           "current_version": e.current_version}
        data = json.dumps(out).encode()
        start_response(status, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))])
        return [data]


def make_app(directory: str) -> OrderService:
    os.makedirs(directory, exist_ok=True)
    engine = create_engine(f"sqlite:///{os.path.join(directory, 'orders.sqlite3')}")

    @event.listens_for(engine, "connect")
    def on_connect(dbapi_connection: Any, record: Any) -> None:  # SQLAlchemy's recommended SQLite set-up
        dbapi_connection.isolation_level = None

    @event.listens_for(engine, "begin")
    def on_begin(conn: Any) -> None:
        conn.exec_driver_sql("BEGIN")

    Base.metadata.create_all(engine)  # the orders and the event markers
    store = EventStore(f"file://{os.path.abspath(os.path.join(directory, 'store'))}", engine,
                       producer_group="order-service", marker=EventMarker,
                       broker_options={"mapped_file_size_commit_log": 16 << 20,
                                       "mapped_file_size_consume_queue": 600_000})
    return OrderService(sessionmaker(engine), store.start())


def request(app: OrderService, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[str, Any]:
    data = json.dumps(body).encode() if body is not None else b""
    environ = {"REQUEST_METHOD": method, "PATH_INFO": path, "CONTENT_LENGTH": str(len(data)),
               "wsgi.input": io.BytesIO(data)}
    got: list[str] = []
    out = b"".join(app(environ, lambda status, headers: got.append(status)))
    return got[0], json.loads(out)


def demo(app: OrderService) -> None:
    import time
    import uuid

    number = f"A-{uuid.uuid4().hex[:6]}"
    for method, path, body in [("POST", "/orders", {"number": number, "total": 42}),
                               ("POST", f"/orders/{number}/pay", {"expected_version": 1}),
                               ("POST", f"/orders/{number}/pay", {"expected_version": 1}),
                               ("POST", f"/orders/{number}/cancel", {"reason": "changed my mind"})]:
        print(method, path, json.dumps(body), "->", *request(app, method, path, body))
    time.sleep(0.2)  # END_TRANSACTION is one-way: give the broker a moment before reading
    print("GET", f"/orders/{number}/events", "->", *request(app, "GET", f"/orders/{number}/events"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="var/sqlalchemy-orders", help="database and store directory")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--demo", action="store_true", help="run a few requests in-process and exit")
    args = ap.parse_args()
    app = make_app(args.dir)
    try:
        if args.demo:
            demo(app)
            return
        with make_server("127.0.0.1", args.port, app) as server:
            print(f"serving on http://127.0.0.1:{args.port}/orders")
            server.serve_forever()
    finally:
        app.store.close()


if __name__ == "__main__":
    main()
