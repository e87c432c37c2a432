"""`rmq_eventstore.kombu` on kombu's event loop (`kombu.asynchronous.Hub`, Celery's asynloop).

- On a bare hub: deliveries come from `on_readable`, never more than the prefetch count is popped (the rest
  stays in the broker while there is no credit), and an ack resumes consumption; re-registering is
  idempotent (one reader, one tick callback, on one hub), closing the connection leaves nothing on the hub;
  a broker that goes away is raised from the hub as one of the transport's `connection_errors`.
- Real Celery worker processes (solo and prefork pools) run their asynloop on the transport (a custom
  remote-control command reports the loop), consume and ack every task once, hold no more unacked tasks
  than `worker_prefetch_multiplier` allows (counted by the broker), and answer `ping`.

Each of these fails on the synchronous transport (no reader on the hub, Celery picks its synloop).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Connection, Consumer, Producer, Queue
from kombu.asynchronous import Hub

import rmq_eventstore.kombu  # noqa: F401  (registers the rocketmq:// scheme)
from rmq_eventstore.broker import serve_in_thread
from rmq_eventstore.client import ensure_local_broker, stop_local_broker

ROOT = Path(__file__).resolve().parents[1]
SMALL = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
         "max_hash_slot_num": 4096, "max_index_num": 16384}


@pytest.fixture(scope="module")
def namesrv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = tmp_path_factory.mktemp("kombu-async") / "store"
    broker = ensure_local_broker(store, idle_exit=None, broker_options=SMALL)
    yield broker.namesrv_addr
    stop_local_broker(store)


@pytest.fixture
def ns() -> str:
    return "t" + uuid.uuid4().hex[:12]


def conn(namesrv: str, ns: str) -> Connection:
    return Connection(f"rocketmq://{namesrv}//", transport_options={"namespace": ns, "visibility_timeout": 60})


def run_until(hub: Hub, cond, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not cond() and time.monotonic() < deadline:
        hub.run_once()
    return bool(cond())


def waiting(c: Connection, queue: str) -> int:
    """Messages of `queue` not popped by anyone yet (the broker's count)."""
    return c.default_channel.queue_declare(queue, passive=True).message_count


# -- a bare hub ----------------------------------------------------------------------------------------------------
def test_hub_delivers_within_credit_and_resumes_on_ack(namesrv: str, ns: str) -> None:
    queue = Queue("hq")
    got: list = []
    with conn(namesrv, ns) as c, conn(namesrv, ns) as pub:
        p = Producer(pub.channel())
        for i in range(5):
            p.publish({"i": i}, routing_key="hq", declare=[queue])
        hub = Hub()
        try:
            with Consumer(c.channel(), [queue], callbacks=[lambda body, m: got.append(m)], prefetch_count=2):
                c.register_with_event_loop(hub)
                assert run_until(hub, lambda: len(got) == 2, 5)
                run_until(hub, lambda: False, 1.5)  # no credit: nothing more is delivered, nor popped
                assert len(got) == 2
                assert waiting(pub, "hq") == 3
                hub.call_soon(got[0].ack)  # one credit back: one more
                assert run_until(hub, lambda: len(got) == 3, 3)
                run_until(hub, lambda: False, 0.5)
                assert len(got) == 3 and waiting(pub, "hq") == 2
                # acks from another thread wake the hub (its poll would otherwise sleep 10 s: a timer is due
                # in a minute) and consumption goes on, never holding more than the prefetch count
                hub.call_later(60, lambda: None)
                while len(got) < 5:
                    n = len(got)
                    for m in got:
                        if not m.acknowledged:
                            ack_in_thread(m)
                    assert run_until(hub, lambda n=n: len(got) > n, 3)
                    assert sum(not m.acknowledged for m in got) <= 2
                for m in got:
                    if not m.acknowledged:
                        m.ack()
            assert sorted(m.payload["i"] for m in got) == list(range(5))
        finally:
            hub.close()


def test_hub_holds_what_a_lowered_prefetch_does_not_allow(namesrv: str, ns: str) -> None:
    """The prefetch count drops while a POP's messages are being delivered: the rest is held (popped,
    counted as held, not delivered) until acks make room again."""
    queue = Queue("lq")
    got: list = []

    def on_message(body: Any, message: Any) -> None:
        got.append(message)
        if len(got) == 1:
            message.channel.basic_qos(0, 1, False)

    with conn(namesrv, ns) as c, conn(namesrv, ns) as pub:
        p = Producer(pub.channel())
        for i in range(3):
            p.publish({"i": i}, routing_key="lq", declare=[queue])
        hub = Hub()
        try:
            with Consumer(c.channel(), [queue], callbacks=[on_message], prefetch_count=3):
                c.register_with_event_loop(hub)
                assert run_until(hub, lambda: len(got) == 1 and waiting(pub, "lq") == 0, 5)
                run_until(hub, lambda: False, 1.5)
                assert len(got) == 1  # two popped by the same POP, held
                for k in (2, 3):
                    hub.call_soon(got[-1].ack)
                    assert run_until(hub, lambda k=k: len(got) == k, 3)
                    run_until(hub, lambda: False, 0.3)
                    assert len(got) == k and sum(not m.acknowledged for m in got) == 1
                got[-1].ack()
            assert sorted(m.payload["i"] for m in got) == [0, 1, 2]
        finally:
            hub.close()


def test_hub_gives_back_what_a_cancelled_consumer_was_popping(namesrv: str, ns: str) -> None:
    queue = Queue("cq")
    got: list = []
    with conn(namesrv, ns) as c, conn(namesrv, ns) as pub:
        hub = Hub()
        try:
            consumer = Consumer(c.channel(), [queue], callbacks=[lambda body, m: got.append(m)])
            consumer.consume()
            c.register_with_event_loop(hub)
            hub.run_once()  # a POP long poll is under way
            consumer.cancel()
            Producer(pub.channel()).publish({"x": 1}, routing_key="cq", declare=[queue])
            run_until(hub, lambda: False, 2)  # the POP brings it: nobody consumes it any more
            assert got == []
            other = pub.SimpleQueue("cq")
            m = other.get(timeout=5)  # given back at once, not after the 60 s visibility timeout
            assert m.payload == {"x": 1}
            m.ack()
        finally:
            hub.close()


def ack_in_thread(message: Any) -> None:
    t = threading.Thread(target=message.ack)
    t.start()
    t.join()


def test_reregistering_is_idempotent_and_close_leaves_nothing(namesrv: str, ns: str) -> None:
    hub, other = Hub(), Hub()
    try:
        base_ticks = len(hub.on_tick)
        c = conn(namesrv, ns)
        c.connect()
        c.register_with_event_loop(hub)
        c.register_with_event_loop(hub)
        assert len(hub.readers) == 1 and len(hub.on_tick) == base_ticks + 1
        c.register_with_event_loop(other)  # moved: nothing left on the first hub
        assert not hub.readers and len(hub.on_tick) == base_ticks
        assert len(other.readers) == 1 and len(other.on_tick) == 1
        other.reset()  # what Celery does on a connection error: reset the hub, collect the connection...
        c.collect()
        assert not other.on_tick and not other.readers
        c2 = conn(namesrv, ns)  # ... and register a new one: only its reader and tick are on the hub
        c2.connect()
        try:
            c2.register_with_event_loop(other)
            assert len(other.readers) == 1 and len(other.on_tick) == 1
        finally:
            c2.close()
        assert not other.readers and not other.on_tick
    finally:
        hub.close()
        other.close()


def test_lost_broker_is_raised_from_the_hub_as_a_connection_error(tmp_path: Path) -> None:
    rb = serve_in_thread(tmp_path / "store", **SMALL)
    hub = Hub()
    c = Connection(f"rocketmq://{rb.namesrv_address}//", transport_options={"max_poll": 0.5})
    try:
        queue = Queue("lost")
        got: list = []
        with Consumer(c.channel(), [queue], callbacks=[lambda body, m: (got.append(body), m.ack())]):
            c.register_with_event_loop(hub)
            Producer(c.channel()).publish({"x": 1}, routing_key="lost", declare=[queue])
            assert run_until(hub, lambda: got == [{"x": 1}], 5)
            rb.close()
            with pytest.raises(c.connection_errors):
                run_until(hub, lambda: False, 15)
        c.close()  # closing a lost connection raises nothing
        assert not hub.readers and not hub.on_tick
    finally:
        c.close()
        hub.close()
        rb.close()


# -- Celery workers -----------------------------------------------------------------------------------------------
CELERY_APP = """
import os
import time

import rmq_eventstore.kombu  # noqa: F401
from celery import Celery
from celery.worker.control import inspect_command

app = Celery("aapp", broker=os.environ["AAPP_BROKER"])
app.conf.broker_transport_options = {"namespace": os.environ["AAPP_NS"], "visibility_timeout": 60}
app.conf.broker_connection_retry_on_startup = True
app.conf.worker_prefetch_multiplier = 2
app.conf.task_acks_late = True
app.conf.task_ignore_result = True


@inspect_command()
def event_loop(state):
    c = state.consumer
    t = c.connection.transport
    info = {"loop": c.loop.__name__, "hub": c.hub is not None, "prefetch": c.qos.value,
            "asynchronous": t.implements.asynchronous}
    if c.hub is not None:  # what transports of ours have on the hub: readers and tick callbacks
        ours = [getattr(cb, "__self__", None) for cb, _ in c.hub.readers.values() if cb is not None]
        ours += [getattr(cb, "__self__", None) for cb in c.hub.on_tick]
        ours = [o for o in ours if type(o).__module__ == "rmq_eventstore.kombu.transport"]
        info["registrations"] = len(ours)
        info["current"] = all(o is t for o in ours)
    return info


@app.task
def work(i, seconds):
    time.sleep(seconds)
    with open(os.path.join(os.environ["AAPP_DONE"], str(i)), "w"):
        pass
"""


@contextlib.contextmanager
def celery_worker(tmp_path: Path, broker_url: str, ns: str, pool: str, concurrency: int) -> Iterator[Any]:
    """A worker process of the app above (`-P pool -c concurrency`), and the app imported here as its client:
    yields the app module, with `node` (the worker's name) and `done` (the directory tasks write to) set."""
    done = tmp_path / "done"
    done.mkdir()
    (tmp_path / "aapp.py").write_text(CELERY_APP)
    env = dict(os.environ, PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}", AAPP_BROKER=broker_url, AAPP_NS=ns,
               AAPP_DONE=str(done))
    sys.path.insert(0, str(tmp_path))
    old_env = {k: os.environ.get(k) for k in ("AAPP_BROKER", "AAPP_NS", "AAPP_DONE")}
    os.environ.update({k: env[k] for k in old_env})
    sys.modules.pop("aapp", None)
    import aapp

    aapp.node = f"w-{ns}@{socket.gethostname()}"
    aapp.done = done
    worker = subprocess.Popen([sys.executable, "-m", "celery", "-A", "aapp", "worker", "-P", pool, "-c",
                               str(concurrency), "-n", aapp.node, "--without-mingle", "--without-gossip",
                               "--without-heartbeat", "-l", "warning"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not aapp.app.control.ping(destination=[aapp.node], timeout=1):
            assert worker.poll() is None, worker.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the worker never answered ping"
        yield aapp
    finally:
        worker.terminate()  # the main process only: SIGTERM to the whole group can leave billiard's pool hung
        try:
            worker.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        aapp.app.pool.force_close_all()
        for k, v in old_env.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        sys.modules.pop("aapp", None)
        sys.path.remove(str(tmp_path))


def event_loop_info(aapp: Any) -> dict[str, Any]:
    [reply] = aapp.app.control.broadcast("event_loop", reply=True, timeout=10, destination=[aapp.node], limit=1)
    return reply[aapp.node]


def wait_done(aapp: Any, n: int, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while len(os.listdir(aapp.done)) < n:
        assert time.monotonic() < deadline, f"{len(os.listdir(aapp.done))}/{n} tasks ran"
        time.sleep(0.05)


@pytest.mark.parametrize("pool,concurrency", [("solo", 1), ("prefork", 2)])
def test_celery_worker_runs_its_asynloop_on_the_transport(namesrv: str, ns: str, tmp_path: Path, pool: str,
                                                          concurrency: int) -> None:
    with celery_worker(tmp_path, f"rocketmq://{namesrv}//", ns, pool, concurrency) as aapp:
        app, done = aapp.app, aapp.done
        prefetch = 2 * concurrency  # worker_prefetch_multiplier 2
        assert event_loop_info(aapp) == {"loop": "asynloop", "hub": True, "prefetch": prefetch,
                                         "asynchronous": True, "registrations": 2,  # one reader, one tick
                                         "current": True}
        n = 12
        for i in range(n):
            aapp.work.delay(i, 0.25)
        held_max = 0
        with app.connection_for_write() as c:
            deadline = time.monotonic() + 60
            while True:
                left = waiting(c, "celery")  # first the broker's count, then the finished ones (see below)
                finished = len(os.listdir(done))
                # popped and not acked yet, at least (a task is acked after its file is written)
                held_max = max(held_max, n - left - finished)
                if finished == n:
                    break
                assert time.monotonic() < deadline, f"{finished}/{n} tasks ran"
                time.sleep(0.05)
        assert held_max <= prefetch, f"{held_max} tasks held at once, prefetch is {prefetch}"
        assert held_max >= 2  # it did prefetch ahead of the running task
        assert sorted(int(f) for f in os.listdir(done)) == list(range(n))
        assert app.control.ping(destination=[aapp.node], timeout=10) == [{aapp.node: {"ok": "pong"}}]
        time.sleep(0.5)
        with app.connection_for_write() as c:
            assert waiting(c, "celery") == 0  # all acked: nothing comes back


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_celery_worker_reregisters_once_after_the_broker_restarts(tmp_path: Path, ns: str) -> None:
    """The broker goes away twice under a worker's asynloop: each time the worker reconnects and the hub holds
    the new connection's reader and tick callback only (the old ones are gone), and tasks run again."""
    ports = {"namesrv_port": _free_port(), "broker_port": _free_port()}
    store = tmp_path / "store"
    rb = serve_in_thread(store, **ports, **SMALL)
    try:
        with celery_worker(tmp_path, f"rocketmq://{rb.namesrv_address}//", ns, "solo", 1) as aapp:
            aapp.work.delay(0, 0)
            wait_done(aapp, 1)
            for k in (1, 2):
                rb.close()
                time.sleep(0.5)
                rb = serve_in_thread(store, **ports, **SMALL)
                # this process's pooled connections went with the broker too: fresh ones from here on
                with aapp.app.connection_for_write() as c:
                    deadline = time.monotonic() + 60
                    while not aapp.app.control.ping(destination=[aapp.node], timeout=1, connection=c):
                        assert time.monotonic() < deadline, "the worker did not come back"
                    [reply] = aapp.app.control.broadcast("event_loop", reply=True, timeout=10, limit=1,
                                                         destination=[aapp.node], connection=c)
                    info = reply[aapp.node]
                    assert info["loop"] == "asynloop" and info["registrations"] == 2 and info["current"], info
                    aapp.app.send_task("aapp.work", args=(k, 0), connection=c)
                wait_done(aapp, k + 1)
    finally:
        rb.close()
