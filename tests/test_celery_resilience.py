"""At-least-once with real processes: Celery workers on `rmq_eventstore.kombu`, a broker process, SIGKILLs.

- A worker killed mid-task (`acks_late`): its pool child (the task is given back at once with
  `task_reject_on_worker_lost`), or the whole worker (the task comes back after `visibility_timeout`, the
  broker's revive): the task runs again on the other worker.
- The broker SIGKILLed while a producer publishes and workers consume, then restarted on the same store
  and ports: every publish `apply_async` returned for runs, duplicates are bounded, and the workers resume
  by themselves (Celery's "Connection to broker lost ... re-establish" path).
- A silent network stall, as Celery's `t/integration/test_connection_recovery.py` makes with its
  BlackholeProxy: a TCP proxy between the workers and the broker stops forwarding without FIN or RST; the
  worker notices within a bounded time, reconnects when the proxy forwards again, loses no task, and a
  worker stopped while the network is stalled exits in bounded time.

Timings measured here are printed (`-s`) and summarised in the README ("What survives what"). CI runs one
variant per guarantee (6 tests, about 80 s); `make resiltest` (CELERY_RESILIENCE_FULL=1) runs all 13 (about 4 min).
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.celery_procs import BrokerProcess, CeleryWorker, runs, tail, wait_for

VT = 3.0  # visibility_timeout of these tests (s)
full_only = pytest.mark.skipif(not os.environ.get("CELERY_RESILIENCE_FULL"),
                               reason="another variant of the same guarantee runs in CI; `make resiltest` runs all")


class Worker(CeleryWorker):
    """A real `celery worker` on tests/celery_resilience_app.py."""

    def __init__(self, tmp: Path, name: str, broker_url: str, run_log: Path, pool: str = "prefork",
                 concurrency: int = 1, env: dict[str, str] | None = None) -> None:
        super().__init__(tmp, name, "tests.celery_resilience_app",
                         {"RESIL_BROKER": broker_url, "RESIL_LOG": str(run_log), "RESIL_VT": str(VT), **(env or {})},
                         pool, concurrency)


@pytest.fixture(autouse=True)
def _no_settlers_left() -> Iterator[None]:
    """The kombu transport keeps one settling POP consumer per name server and group for the process's life (it
    settles what a lost connection delivered; shut down at exit). Each test here has its own broker, so each
    would leave its own behind in this process, heartbeating a broker long gone: shut them down after it."""
    yield
    from rmq_eventstore.kombu import transport

    transport._shutdown_settlers()


@pytest.fixture
def cleanup() -> Iterator[list[Callable[[], object]]]:
    """Functions to call at teardown, last registered first (workers before the broker)."""
    todo: list[Callable[[], object]] = []
    yield todo
    for f in reversed(todo):
        try:
            f()
        except Exception:
            pass


@pytest.fixture
def broker(tmp_path: Path, cleanup: list) -> BrokerProcess:
    b = BrokerProcess(tmp_path / "store")
    b.start()
    cleanup.append(b.stop)
    return b


def producer_app(broker_url: str):  # type: ignore[no-untyped-def]
    """The test process's own Celery app (a producer), as the web app would have."""
    from celery import Celery

    import rmq_eventstore.kombu  # noqa: F401

    app = Celery("resil", broker=broker_url, set_as_current=False)
    app.conf.update(broker_transport_options={"visibility_timeout": VT}, task_default_queue="resil",
                    task_ignore_result=True, broker_connection_timeout=2)
    return app


def starts(log: Path, n: int) -> list[dict]:
    return [r for r in runs(log) if r["n"] == n and r["phase"] == "start"]


# -- 1. a worker killed mid-task ---------------------------------------------------------------------------------
LOST_WAIT = 1.0  # worker_lost_wait: how long Celery waits for a killed pool child's result (default 10 s)


@pytest.mark.parametrize("what", [pytest.param("pool-child", marks=full_only), "whole-worker"])
def test_task_of_a_killed_worker_runs_again_on_another(what: str, broker: BrokerProcess, tmp_path: Path,
                                                       cleanup: list) -> None:
    """acks_late + task_reject_on_worker_lost. A killed pool child: Celery rejects the task with requeue once
    `worker_lost_wait` is over; it is visible again at once, long before its lease (30 s here) ends. The whole
    worker killed: nobody rejects; the broker's revive brings the task back when its lease (VT) ends."""
    url = f"rocketmq://{broker.namesrv}//"
    run_log = tmp_path / "runs.jsonl"
    vt = 30.0 if what == "pool-child" else VT
    env = {"RESIL_VT": str(vt), "RESIL_LOST_WAIT": str(LOST_WAIT)}
    a = Worker(tmp_path, "a", url, run_log, env=env)
    cleanup.append(a.killpg)
    a.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 30.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(a.log)
    first = starts(run_log, 1)[0]
    b = Worker(tmp_path, "b", url, run_log, env=env)  # started now, so that worker a took the task
    cleanup.append(b.killpg)
    b.wait_ready()
    if what == "pool-child":
        assert first["pid"] in a.children()
        os.kill(first["pid"], signal.SIGKILL)
    else:
        a.killpg()
    killed = time.monotonic()
    assert wait_for(lambda: len(starts(run_log, 1)) >= 2, 30), tail(a.log) + "\n---\n" + tail(b.log)
    again = time.monotonic() - killed
    second = starts(run_log, 1)[1]
    leased = second["t"] - first["t"]  # the lease starts when worker a popped the task
    print(f"\n{what} SIGKILLed: the task ran again {again:.2f} s after the kill, {leased:.2f} s after its first "
          f"start (visibility_timeout {vt} s, worker_lost_wait {LOST_WAIT} s), on {second['host']}")
    assert second["pid"] != first["pid"]
    assert second["redelivered"] is True
    if what == "whole-worker":
        assert second["host"].startswith("b@")
        assert VT - 0.5 <= leased < VT + 5  # the dead worker's lease had to run out first, not much more
    else:
        assert "WorkerLostError" in a.text()
        assert again < LOST_WAIT + 5 < vt  # given back by the reject, not by the lease's end
    assert wait_for(lambda: any(r["n"] == 1 and r["phase"] == "end" for r in runs(run_log)), 40)


@full_only
def test_without_reject_on_worker_lost_a_killed_pool_child_loses_its_task(broker: BrokerProcess, tmp_path: Path,
                                                                          cleanup: list) -> None:
    """Celery's documented default, shown on this transport: acks_late alone does not bring back the task of a
    killed pool child; Celery acks it as failed (WorkerLostError). Hence the README's advice to set
    task_reject_on_worker_lost."""
    url = f"rocketmq://{broker.namesrv}//"
    run_log = tmp_path / "runs.jsonl"
    a = Worker(tmp_path, "a", url, run_log, env={"RESIL_REJECT_ON_LOST": "0", "RESIL_LOST_WAIT": str(LOST_WAIT)})
    cleanup.append(a.killpg)
    a.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 30.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(a.log)
    os.kill(starts(run_log, 1)[0]["pid"], signal.SIGKILL)
    assert wait_for(lambda: "WorkerLostError" in a.text(), 20), tail(a.log)
    time.sleep(VT + 2)  # past the lease: an unacked task would be back by now
    assert len(starts(run_log, 1)) == 1


# -- 2. the broker killed mid-stream -----------------------------------------------------------------------------
class Publisher(threading.Thread):
    """Publishes tasks 0..n-1 in order, as a web app would: a publish that raises is tried again (after a pause)
    until `apply_async` returns; `acked` are the tasks whose `apply_async` returned."""

    def __init__(self, url: str, n: int, pace: float = 0.005) -> None:
        super().__init__(daemon=True, name="publisher")
        self.url, self.n, self.pace = url, n, pace
        self.acked: list[int] = []
        self.failures = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        app = None
        try:
            app = producer_app(self.url)
            task = app.signature("tests.celery_resilience_app.record")
            deadline = time.monotonic() + 120
            for i in range(self.n):
                while True:
                    try:
                        task.apply_async((i, 0.01), retry_policy={"max_retries": 1, "interval_start": 0.2})
                        break
                    except Exception:
                        self.failures += 1
                        assert time.monotonic() < deadline, "publishing did not recover within 120 s"
                        time.sleep(0.2)
                self.acked.append(i)
                time.sleep(self.pace)
        except BaseException as e:  # reported by the test
            self.error = e
        finally:
            if app is not None:  # its pools' connections (the transport's clients and their threads)
                app.amqp.producer_pool.force_close_all()
                app.pool.force_close_all()
                app.close()


SMALL_BROKER = {"mapped_file_size_commit_log": 4 << 20, "mapped_file_size_consume_queue": 200_000,
                "max_hash_slot_num": 4096, "max_index_num": 16384}


class LocalStoreBroker:
    """The broker of a `rocketmq:///path` URL: started by whichever process comes first (a worker, the
    producer), found through `<store>/broker.json`; after a SIGKILL the next one to connect starts a new one."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.url = f"rocketmq://{store}"

    def pid(self) -> int | None:
        from rmq_eventstore.common.broker_file import read_broker_file

        data = read_broker_file(str(self.store))
        return data["pid"] if data else None

    def kill(self) -> None:
        pid = self.pid()
        assert pid is not None
        os.kill(pid, signal.SIGKILL)

        def gone() -> bool:  # reaped, or a zombie; the process can vanish between the two reads (ESRCH)
            try:
                with open(f"/proc/{pid}/stat") as f:
                    return f.read().split(") ")[1][:1] == "Z"
            except OSError:
                return True

        assert wait_for(gone, 10)

    def stop(self) -> None:
        from rmq_eventstore.client import stop_local_broker

        stop_local_broker(self.store)
        for entry in os.listdir("/proc"):  # a broker that never announced itself
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    args = f.read().split(b"\0")
            except OSError:
                continue
            if b"serve" in args and os.fsencode(str(self.store)) in args:
                os.kill(int(entry), signal.SIGKILL)


@pytest.mark.parametrize("where", [pytest.param("same-ports", marks=full_only), "local-store"])
def test_broker_sigkill_mid_stream_loses_no_acknowledged_publish(where: str, tmp_path: Path, cleanup: list) -> None:
    """same-ports: `rocketmq://host:port//`, the broker restarted by hand on the same store and ports.
    local-store: `rocketmq:///path`, nobody restarts it: the first process to reconnect (a worker or the
    producer) starts a new broker on the store, at new ports, which everyone finds in broker.json."""
    broker: BrokerProcess | LocalStoreBroker
    env = {"RESIL_VT": "20"}  # longer than the broker's restart: acks that failed while it was down land later
    if where == "same-ports":
        broker = BrokerProcess(tmp_path / "store")
        broker.start()
        url = f"rocketmq://{broker.namesrv}//"
    else:
        broker = LocalStoreBroker(tmp_path / "store")
        url = broker.url
        env["RESIL_BROKER_OPTIONS"] = json.dumps(SMALL_BROKER)
    cleanup.append(broker.stop)
    run_log = tmp_path / "runs.jsonl"
    workers = [Worker(tmp_path, name, url, run_log, pool="solo", env=env) for name in ("a", "b")]
    for w in workers:
        cleanup.append(w.killpg)
    for w in workers:
        w.wait_ready()
    n = 400
    pub = Publisher(url, n)
    pub.start()
    assert wait_for(lambda: len(pub.acked) >= n // 3 and len({r["n"] for r in runs(run_log)}) >= n // 6, 60), \
        (len(pub.acked), len(runs(run_log)), pub.error)
    broker.kill()
    killed_at = len(pub.acked)
    down = time.monotonic()
    if isinstance(broker, BrokerProcess):
        time.sleep(1.0)
        broker.start()
    print(f"\n{where}: broker SIGKILLed after {killed_at} publishes")
    pub.join(150)
    assert not pub.is_alive() and pub.error is None, pub.error
    print(f"publishing resumed; all {n} publishes acknowledged {time.monotonic() - down:.1f} s after the kill")
    acked = set(pub.acked)
    assert len(acked) == n

    def missing() -> set[int]:
        return acked - {r["n"] for r in runs(run_log) if r["phase"] == "end"}

    ok = wait_for(lambda: not missing(), 90, 0.2)
    resumed = {r["host"].split("@")[0] for r in runs(run_log) if r["n"] >= killed_at + 50}
    counts = Counter(r["n"] for r in runs(run_log) if r["phase"] == "start")
    dups = {i: c for i, c in counts.items() if c > 1}
    print(f"publish failures during the outage: {pub.failures}; executions {sum(counts.values())} of {n} tasks; "
          f"tasks run more than once: {len(dups)} {sorted(dups)[:20]}; workers after the restart: {sorted(resumed)}")
    assert ok, f"{len(missing())} acknowledged publishes never ran: {sorted(missing())[:20]}\n" + \
        "\n---\n".join(tail(w.log) for w in workers)
    assert all(w.proc.poll() is None for w in workers)
    assert resumed == {"a", "b"}, "a worker did not resume consuming after the broker restarted"
    for w in workers:
        assert "Connection to broker lost" in w.text()
    # at most the messages held at the kill run twice: one per worker (solo, prefetch 1), whose ack was lost
    # (acks are sent again until they land, so usually none)
    assert len(dups) <= len(workers), dups


# -- 3. a silent network stall -------------------------------------------------------------------------------------
class BlackholeProxy:
    """A TCP proxy `listen` -> `target` that can stop forwarding without closing anything (no FIN, no RST): in
    `blackhole()` it neither accepts, reads nor writes, so the peers see a silent network, as with Celery's
    BlackholeProxy (`t/integration/test_connection_recovery.py`); `forward()` resumes where it stopped."""

    def __init__(self, listen: tuple[str, int], target: tuple[str, int]) -> None:
        self.target = target
        self.server = socket.create_server(listen)
        self._forwarding = threading.Event()
        self._forwarding.set()
        self._stop = threading.Event()
        self._sever = threading.Event()
        self._peer: dict[socket.socket, socket.socket] = {}
        self._severed: list[socket.socket] = []  # kept open, unread
        self._thread = threading.Thread(target=self._run, daemon=True, name=f"blackhole-proxy-{listen[1]}")
        self._thread.start()

    def blackhole(self) -> None:
        self._forwarding.clear()

    def forward(self) -> None:
        self._forwarding.set()

    def sever(self) -> None:
        """Make every connection open now half-open: never forwarded again, never closed (as after a NAT or
        load balancer dropped its state); new connections are forwarded."""
        self._sever.set()
        assert wait_for(lambda: not self._sever.is_set(), 5)

    def _drop(self, sel: selectors.BaseSelector, s: socket.socket) -> None:
        for x in (s, self._peer.pop(s, None)):
            if x is None:
                continue
            self._peer.pop(x, None)
            try:
                sel.unregister(x)
            except (KeyError, ValueError):
                pass
            x.close()

    def _run(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self.server, selectors.EVENT_READ)
        while not self._stop.is_set():
            if not self._forwarding.is_set():
                self._forwarding.wait(0.05)
                continue
            if self._sever.is_set():
                for x in list(self._peer):
                    sel.unregister(x)
                    self._severed.append(x)
                self._peer.clear()
                self._sever.clear()
            for key, _ in sel.select(0.05):
                if not self._forwarding.is_set():
                    break
                s = key.fileobj
                if s is self.server:
                    client, _ = self.server.accept()
                    try:
                        upstream = socket.create_connection(self.target, timeout=5)
                    except OSError:
                        client.close()
                        continue
                    for x in (client, upstream):
                        x.settimeout(10)
                        sel.register(x, selectors.EVENT_READ)
                    self._peer[client], self._peer[upstream] = upstream, client
                    continue
                assert isinstance(s, socket.socket)
                try:
                    data = s.recv(1 << 16)
                    if data:
                        self._peer[s].sendall(data)
                        continue
                except (OSError, KeyError):
                    pass
                self._drop(sel, s)
        for s in list(self._peer):
            self._drop(sel, s)
        for s in self._severed:
            s.close()
        sel.close()

    def close(self) -> None:
        self._stop.set()
        self._forwarding.set()
        self._thread.join(5)
        self.server.close()


@pytest.fixture
def stalled_broker(tmp_path: Path, cleanup: list) -> tuple[BrokerProcess, list[BlackholeProxy], str]:
    """A broker that registers itself as 127.0.0.2 (brokerIP1), and proxies on 127.0.0.2 in front of its name
    server and broker ports: clients given `rocketmq://127.0.0.2:<port>//` go through the proxies only."""
    b = BrokerProcess(tmp_path / "store", {"brokerIP1": "127.0.0.2"})
    b.start()
    cleanup.append(b.stop)
    proxies = [BlackholeProxy(("127.0.0.2", port), ("127.0.0.1", port)) for port in (b.namesrv_port, b.broker_port)]
    for p in proxies:
        cleanup.append(p.close)
    return b, proxies, f"rocketmq://127.0.0.2:{b.namesrv_port}//"


def first_line_after(text: str, needle: str, after: float) -> float | None:
    """The time of the first log line holding `needle` stamped at or after `after` (epoch s)."""
    for line in text.splitlines():
        if needle in line and line.startswith("[20"):
            t = time.mktime(time.strptime(line[1:20], "%Y-%m-%d %H:%M:%S")) + int(line[21:24]) / 1000
            if t >= after:
                return t
    return None


def test_silent_stall_is_detected_and_survived(stalled_broker: tuple, tmp_path: Path, cleanup: list) -> None:
    _, proxies, url = stalled_broker
    run_log = tmp_path / "runs.jsonl"
    w = Worker(tmp_path, "a", url, run_log, pool="solo")
    cleanup.append(w.killpg)
    w.wait_ready()
    n = 60
    app = producer_app(url)
    task = app.signature("tests.celery_resilience_app.record")
    with app.connection_for_write() as conn:
        for i in range(n):
            task.apply_async((i, 0.1), connection=conn)
    assert wait_for(lambda: len({r["n"] for r in runs(run_log)}) >= n // 3, 60), tail(w.log)
    stalled = time.time()
    for p in proxies:
        p.blackhole()
    assert wait_for(lambda: first_line_after(w.text(), "Connection to broker lost", stalled), 60), tail(w.log)
    detected = first_line_after(w.text(), "Connection to broker lost", stalled) - stalled
    time.sleep(3.0)  # the worker tries to reconnect while the network is still silent
    resumed = time.time()
    for p in proxies:
        p.forward()
    assert wait_for(lambda: first_line_after(w.text(), "Connected to", resumed), 60), tail(w.log)
    reconnected = first_line_after(w.text(), "Connected to", resumed) - resumed
    ok = wait_for(lambda: {r["n"] for r in runs(run_log) if r["phase"] == "end"} >= set(range(n)), 60, 0.2)
    counts = Counter(r["n"] for r in runs(run_log) if r["phase"] == "start")
    dups = sorted(i for i, c in counts.items() if c > 1)
    print(f"\nstall detected after {detected:.1f} s; reconnected {reconnected:.1f} s after the network came back; "
          f"tasks run twice: {dups}")
    assert ok, tail(w.log)
    assert detected < 15
    assert reconnected < 40
    assert w.proc.poll() is None


@full_only
def test_worker_stopped_during_a_silent_stall_exits_in_bounded_time(stalled_broker: tuple, tmp_path: Path,
                                                                    cleanup: list) -> None:
    """celery#975: a warm shutdown (SIGTERM) while the broker is silent must not hang forever; the task that was
    running finishes, its ack cannot reach the broker, and it runs again after the stall (at least once)."""
    _, proxies, url = stalled_broker
    run_log = tmp_path / "runs.jsonl"
    w = Worker(tmp_path, "a", url, run_log, pool="solo")
    cleanup.append(w.killpg)
    w.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 2.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(w.log)
    for p in proxies:
        p.blackhole()
    took = w.stop(timeout=60)
    print(f"\nworker stopped during a stall: exited after {took:.1f} s")
    assert took < 30, tail(w.log)
    for p in proxies:
        p.forward()
    b = Worker(tmp_path, "b", url, run_log, pool="solo")
    cleanup.append(b.killpg)
    b.wait_ready()
    assert wait_for(lambda: len(starts(run_log, 1)) >= 2, 30), tail(b.log)


def test_a_half_open_connection_is_replaced_after_one_timeout(stalled_broker: tuple) -> None:
    """A request that times out on a connection silent for the whole wait closes it (RocketMQ's
    clientCloseSocketIfTimeout), so the next request connects afresh rather than waiting on it forever."""
    from rmq_eventstore.client import Message, Producer, RemotingTimeoutError

    broker, proxies, _ = stalled_broker
    with Producer(broker.namesrv, "half-open", retry_times_when_send_failed=0, send_timeout_ms=1000) as p:
        p.send(Message("half-open", b"1"))  # route and connection made (to the proxy, 127.0.0.2)
        proxies[1].sever()
        t0 = time.monotonic()
        with pytest.raises(RemotingTimeoutError):
            p.send(Message("half-open", b"2"))
        assert time.monotonic() - t0 < 3
        assert p.send(Message("half-open", b"3")).queue_offset >= 0  # a new connection


@pytest.mark.parametrize("outage", [pytest.param("broker-restart", marks=full_only), "half-open"])
def test_a_task_running_across_a_reconnect_runs_once(outage: str, stalled_broker: tuple, tmp_path: Path,
                                                     cleanup: list) -> None:
    """acks_late: a task still running when the worker loses its connection keeps its lease (it is not given
    back when the old connection closes), and its ack, sent after the worker reconnected, settles it: it runs
    once. (With the lease over before the ack, the broker would deliver it again: at least once.)"""
    broker, proxies, url = stalled_broker
    run_log = tmp_path / "runs.jsonl"
    vt = 8.0
    w = Worker(tmp_path, "a", url, run_log, env={"RESIL_VT": str(vt)})
    cleanup.append(w.killpg)
    w.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 4.0), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(w.log)
    t0 = time.time()
    if outage == "broker-restart":
        broker.kill()
        time.sleep(1.0)
        broker.start()
    else:
        proxies[1].sever()
    assert wait_for(lambda: first_line_after(w.text(), "Connected to", t0), 30), tail(w.log)
    assert wait_for(lambda: any(r["phase"] == "end" for r in runs(run_log)), 30), tail(w.log)
    time.sleep(max(starts(run_log, 1)[0]["t"] + vt + 2 - time.time(), 0))  # past the lease
    assert len(starts(run_log, 1)) == 1, tail(w.log)
    if "Couldn't ack" in w.text():  # the broker was not back yet when the task ended: the ack was sent again
        assert "failed on a lost connection landed" in w.text(), tail(w.log)


# -- connection_errors: everything a lost connection raises is one ------------------------------------------------
@pytest.mark.parametrize("outage", ["broker-killed", pytest.param("silent", marks=full_only)])
def test_what_a_lost_connection_raises_is_in_connection_errors(outage: str, stalled_broker: tuple) -> None:
    """Publishing, draining and rejecting on a lost connection raise only `connection_errors` (so kombu
    retries and Celery reconnects), and the connection still closes in bounded time. An ack returns at once
    (the connection's ack batcher sends it). Afterwards: the ack that failed is sent again once the broker
    answers, within the message's lease, so that message never comes back; the rejected one (its give-back
    failed too) comes back when its lease ends."""
    import kombu

    import rmq_eventstore.kombu  # noqa: F401

    broker, proxies, url = stalled_broker
    # longer than the outage (the broker's restart; the stall, made longer by the timeouts below), so that the
    # ack sent again lands within the lease
    vt = 12.0 if outage == "broker-killed" else 25.0
    opts = {"visibility_timeout": vt}
    with kombu.Connection(url, transport_options=opts) as c:
        q = c.SimpleQueue("errs")
        q.put({"n": 1})
        q.put({"n": 2})
        held = [q.get(timeout=10), q.get(timeout=10)]
        leased = time.monotonic()
        if outage == "broker-killed":
            broker.kill()
        else:
            for p in proxies:
                p.blackhole()
        errors = c.connection_errors
        t0 = time.monotonic()
        held[0].ack()  # taken by the batcher; it fails on the lost connection and is sent again later
        assert time.monotonic() - t0 < 0.5
        attempts = {
            "reject": lambda: held[1].reject(requeue=True),
            "drain": lambda: c.drain_events(timeout=1),
            "publish": lambda: c.default_channel.basic_publish(
                c.default_channel.prepare_message("x"), exchange="", routing_key="errs"),
        }
        raised = {}
        for name, attempt in attempts.items():
            t0 = time.monotonic()
            with pytest.raises(errors) as e:
                attempt()
            raised[name] = (type(e.value).__name__, round(time.monotonic() - t0, 1))
        t0 = time.monotonic()
        c.close()  # no restore attempts on the lost connection
        closed_in = time.monotonic() - t0
    print(f"\n{outage}: raised {raised}; closed in {closed_in:.1f} s")
    assert closed_in < 10
    if outage == "broker-killed":
        broker.start()
    else:
        for p in proxies:
            p.forward()
    with kombu.Connection(url, transport_options=opts) as c:
        q = c.SimpleQueue("errs")
        got = []
        while time.monotonic() < leased + vt + 4:
            try:
                m = q.get(timeout=max(leased + vt + 4 - time.monotonic(), 0.1))
            except q.Empty:
                break
            m.ack()
            if m.payload != "x":  # (the publish that timed out in the stall may have been stored when it resumed)
                got.append(m.payload["n"])
        assert got == [2]


def test_acks_taken_while_the_broker_is_down_land_once_it_is_back(tmp_path: Path, cleanup: list) -> None:
    """Acks given while the broker is down (SIGKILLed) return at once; their batch fails, marks the
    connection lost (the next drain raises a connection error) and each ack is sent again in the background.
    Once the broker is back (same ports, same store) they land within the lease: of five held messages only
    the two never acked come back, and the acked ones never do, even past their lease."""
    import kombu

    import rmq_eventstore.kombu  # noqa: F401

    b = BrokerProcess(tmp_path / "store")
    b.start()
    cleanup.append(b.stop)
    url = f"rocketmq://{b.namesrv}//"
    vt = 10.0
    opts = {"visibility_timeout": vt}
    c = kombu.Connection(url, transport_options=opts)
    cleanup.append(c.release)
    q = c.SimpleQueue("down")
    for i in range(5):
        q.put({"n": i})
    held = sorted((q.get(timeout=10) for _ in range(5)), key=lambda m: m.payload["n"])
    leased = time.monotonic()
    b.kill()
    t0 = time.monotonic()
    for m in held[:3]:
        m.ack()
    assert time.monotonic() - t0 < 0.5
    assert c.transport.flush_acks(10)  # the batch was tried (and failed): its acks are with the retries now
    with pytest.raises(c.connection_errors):
        c.drain_events(timeout=1)
    b.start()
    with kombu.Connection(url, transport_options=opts) as c2:
        q2 = c2.SimpleQueue("down")
        got = []
        while time.monotonic() < leased + vt + 4:
            try:
                m = q2.get(timeout=max(leased + vt + 4 - time.monotonic(), 0.1))
            except q2.Empty:
                break
            got.append(m.payload["n"])
            m.ack()
    assert sorted(got) == [3, 4]


@full_only
def test_cancel_long_running_tasks_on_connection_loss(stalled_broker: tuple, tmp_path: Path, cleanup: list) -> None:
    """`worker_cancel_long_running_tasks_on_connection_loss=True` (Celery 6's default): the acks_late task running
    when the connection is lost is cancelled; Celery expects the broker to redeliver it, so the transport gives
    it back when the lost connection closes, and it runs again at once, not when its lease (30 s) ends."""
    _, proxies, url = stalled_broker
    run_log = tmp_path / "runs.jsonl"
    vt = 30.0
    w = Worker(tmp_path, "a", url, run_log, env={"RESIL_VT": str(vt), "RESIL_CANCEL_ON_LOSS": "1"})
    cleanup.append(w.killpg)
    w.wait_ready()
    app = producer_app(url)
    with app.connection_for_write() as conn:
        app.send_task("tests.celery_resilience_app.record", (1, 20.0, True), connection=conn)
    assert wait_for(lambda: starts(run_log, 1), 30), tail(w.log)
    t0 = time.monotonic()
    proxies[1].sever()
    assert wait_for(lambda: len(starts(run_log, 1)) >= 2, 40), tail(w.log)
    again = time.monotonic() - t0
    print(f"\ncancelled on connection loss: ran again {again:.1f} s after the loss")
    assert again < vt - 10
    assert wait_for(lambda: any(r["phase"] == "end" for r in runs(run_log)), 20), tail(w.log)
