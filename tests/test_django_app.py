"""The reference Django project (django_app/) as a user runs it: migrate, a real server process, pages and
the JSON API; its broker found or started on first use; SQLite and PostgreSQL."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from rmq_eventstore.client.local import find_local_broker, stop_local_broker

ROOT = Path(__file__).resolve().parent.parent
MANAGE = ROOT / "django_app" / "manage.py"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def call(url: str, body: dict | None = None) -> tuple[int, dict | str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if body is not None else "GET",
                                 headers={"Content-Type": "application/json", "Accept": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            raw, status, ctype = r.read().decode(), r.status, r.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        raw, status, ctype = e.read().decode(), e.code, e.headers.get("Content-Type", "")
    return status, json.loads(raw) if "json" in ctype else raw


@pytest.fixture(params=["sqlite", "postgres"])
def shop(request, tmp_path):
    env = dict(os.environ, SHOP_VAR=str(tmp_path / "var"), PYTHONPATH=str(ROOT), SHOP_DEBUG="0", SHOP_COMMITLOG_MB="4")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    if request.param == "postgres":
        import psycopg

        name = f"shop_test_{os.getpid()}"
        with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f"DROP DATABASE IF EXISTS {name}")
            c.execute(f"CREATE DATABASE {name}")
        env.update(SHOP_DATABASE="postgres", SHOP_DB_NAME=name)
    r = subprocess.run([sys.executable, str(MANAGE), "migrate", "--noinput"], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    port = free_port()
    server = subprocess.Popen([sys.executable, str(MANAGE), "runserver", f"127.0.0.1:{port}", "--noreload"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                break
        except OSError:
            time.sleep(0.1)
    try:
        yield url, tmp_path / "var" / "store"
    finally:
        server.terminate()
        server.wait(10)
        stop_local_broker(tmp_path / "var" / "store")
        if request.param == "postgres":
            import psycopg

            with psycopg.connect("host=127.0.0.1 user=postgres dbname=postgres", autocommit=True) as c:
                c.execute(f"DROP DATABASE IF EXISTS {env['SHOP_DB_NAME']} WITH (FORCE)")


def test_orders_through_pages_and_api(shop):
    url, store = shop
    status, order = call(f"{url}/api/orders/", {"customer": "ada", "lines": [{"sku": "tea", "quantity": 2,
                                                                            "price_cents": 350}]})
    assert status == 201 and order["version"] == 1 and order["total_cents"] == 700, order
    number = order["number"]
    assert find_local_broker(store) is not None  # the first request started the store's broker
    status, body = call(f"{url}/api/orders/{number}/pay/", {"expected_version": 0})
    assert status == 409 and body["current_version"] == 1  # stale: someone else changed it first
    status, body = call(f"{url}/api/orders/{number}/pay/", {"expected_version": 1})
    assert status == 200 and body["status"] == "paid" and body["version"] == 2
    status, body = call(f"{url}/api/orders/{number}/cancel/", {"expected_version": 2})
    assert status == 400 and "needs placed" in body["detail"]
    status, body = call(f"{url}/api/orders/{number}/")
    assert [e["type"] for e in body["events"]] == ["OrderPlaced", "OrderPaid"]
    assert [e["version"] for e in body["events"]] == [1, 2]
    status, page = call(f"{url}/orders/{number}/")
    assert status == 200 and "OrderPlaced" in page and "OrderPaid" in page and "Ship" in page
    status, page = call(f"{url}/")
    assert status == 200 and number in page and "Paid" in page
    status, body = call(f"{url}/api/orders/", {"customer": "", "lines": []})
    assert status == 400
