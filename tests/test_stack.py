"""`make run`'s whole stack as a user runs it (django_app/run_stack.py): the web server, a Celery worker on the
store through rmq_eventstore.kombu, the store's broker process started on first use. An order placed over
HTTP reaches the worker twice: as a task (the confirmation) and as events (the read models)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from rmq_eventstore.client.local import stop_local_broker

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


def post(url: str, body: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def test_order_reaches_the_worker_as_task_and_as_events(tmp_path):
    port = free_port()
    var = tmp_path / "var"
    env = dict(os.environ, SHOP_VAR=str(var), SHOP_PORT=str(port), SHOP_COMMITLOG_MB="4", SHOP_DEBUG="1")
    env.pop("DJANGO_SETTINGS_MODULE", None)
    log = (tmp_path / "stack.log").open("w")
    stack = subprocess.Popen([sys.executable, str(ROOT / "django_app" / "run_stack.py")], env=env, cwd=ROOT,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def tail() -> str:  # what the web server and the worker said, for a failure's message
        return "\n".join((tmp_path / "stack.log").read_text(errors="replace").splitlines()[-40:])

    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                get(f"{url}/api/orders/")
                break
            except OSError:
                assert time.monotonic() < deadline and stack.poll() is None, "the stack did not start:\n" + tail()
                time.sleep(0.3)
        order = post(f"{url}/api/orders/", {"customer": "ada", "lines": [{"sku": "tea", "quantity": 2,
                                                                          "price_cents": 350}]})
        post(f"{url}/api/orders/{order['number']}/pay/", {"expected_version": 1})
        deadline = time.monotonic() + 90
        while True:
            rm = get(f"{url}/api/read-models/")
            done = (rm["customers"] == [{"customer": "ada", "orders": 1, "paid": 1, "cancelled": 0, "total_cents": 700}]
                    and rm["notifications"] and rm["notifications"][0]["order"] == order["number"]
                    and rm["days"] and rm["days"][0]["orders"] == 1)
            if done:
                break
            assert time.monotonic() < deadline, f"{rm}\n{tail()}"
            time.sleep(0.5)
    finally:
        os.killpg(stack.pid, signal.SIGTERM)
        try:
            stack.wait(30)
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
        try:  # anything of the session left (a worker's pool process) goes too
            os.killpg(stack.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        stop_local_broker(var / "store")
