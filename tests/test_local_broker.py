"""Many processes sharing one local store through its owner's broker (`rmq_eventstore.client.local`).

Real processes, real sockets, loopback only. Every broker a test starts is stopped by the `stores`
fixture's finalizer (SIGTERM through `stop_local_broker`, then SIGKILL of whatever still serves the path).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from rmq_eventstore.client import (
    FOUND,
    LocalBroker,
    LocalBrokerError,
    Message,
    Producer,
    PullConsumer,
    ensure_local_broker,
    find_local_broker,
    parse_url,
    resolve_namesrv,
    stop_local_broker,
)
from rmq_eventstore.client.local import PROBE_TIMEOUT, _pid_alive
from rmq_eventstore.common.broker_file import read_broker_file, write_broker_file

ROOT = str(Path(__file__).resolve().parents[1])
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}


def _serve_pids(path: Path) -> list[int]:
    """Pids of `serve` processes whose command line names `path` (brokers that may not have announced)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if b"serve" in args and os.fsencode(str(path)) in args:
            pids.append(int(entry))
    return pids


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`stores(name)`: a store path under tmp_path; its brokers are stopped at teardown."""
    made: list[Path] = []

    def make(name: str = "store") -> Path:
        p = tmp_path / name
        made.append(p)
        return p

    yield make
    for p in made:
        try:
            stop_local_broker(p, timeout=10)
        except LocalBrokerError:
            pass  # embedded in this process: the test closes it
        for pid in _serve_pids(p):
            if pid != os.getpid():
                os.kill(pid, signal.SIGKILL)
                _wait_dead(pid, 5)


def _send_and_pull(namesrv: str, topic: str, body: bytes) -> bytes:
    with Producer(namesrv, "pg-local") as p, PullConsumer(namesrv, "cg-local") as c:
        r = p.send(Message(topic, body), queue_id=0)
        res = c.pull(topic, 0, r.queue_offset, max_nums=1, suspend_timeout_ms=0)
        assert res.status == FOUND
        return res.messages[0].body


# -- URLs -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("url", "expected"), [
    ("file:///srv/app/var/store", ("file", "/srv/app/var/store")),
    ("file://localhost/srv/store/", ("file", "/srv/store")),
    ("file:///srv/with%20space", ("file", "/srv/with space")),
    ("rocketmq:///srv/app/var/store", ("file", "/srv/app/var/store")),
    ("rmq://127.0.0.1:9877", ("namesrv", "127.0.0.1:9877")),
    ("rmq://namesrv.internal", ("namesrv", "namesrv.internal:9876")),
    ("rocketmq://10.0.0.5:9876", ("namesrv", "10.0.0.5:9876")),
    ("rocketmq://10.0.0.5", ("namesrv", "10.0.0.5:9876")),
    ("RMQ://[::1]:9000", ("namesrv", "[::1]:9000")),
])
def test_parse_url(url: str, expected: tuple[str, str]) -> None:
    assert parse_url(url) == expected


@pytest.mark.parametrize(("url", "message"), [
    ("", "non-empty"),
    ("/srv/store", "no scheme"),
    ("file://srv/store", "names a host"),
    ("file:relative/store", "absolute path"),
    ("rocketmq://host:9876/topic", "nothing after it"),
    ("rmq://host:notaport", "invalid port"),
    ("rmq://host:0", "invalid port"),
    ("rmq://:9876", "names no host"),
    ("rmq://user:pw@host:9876", "credentials"),
    ("http://host:9876", "scheme 'http'"),
    ("redis://localhost", "file:///path/to/store"),
])
def test_parse_url_errors(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_url(url)


def test_resolve_namesrv_passes_name_servers_through_and_refuses_a_missing_local_broker(tmp_path: Path) -> None:
    assert resolve_namesrv("rmq://127.0.0.1:9876") == "127.0.0.1:9876"
    with pytest.raises(LocalBrokerError, match="no broker serves"):
        resolve_namesrv(f"file://{tmp_path}/nothing", start=False)
    assert not (tmp_path / "nothing").exists()  # finding creates nothing


# -- finding and starting ---------------------------------------------------------------------------------
def test_first_caller_starts_second_finds(stores: Callable[[str], Path]) -> None:
    store = stores("s")
    first = ensure_local_broker(store, idle_exit=60)
    assert first.started_by_us and first.pid != os.getpid() and _pid_alive(first.pid)
    announced = read_broker_file(store)
    assert announced is not None
    assert (announced["pid"], announced["namesrv"], announced["broker"]) == (first.pid, first.namesrv_addr,
                                                                              first.broker_addr)
    assert announced["version"] == 1 and announced["started_ms"] > 0
    second = ensure_local_broker(store)
    assert second == LocalBroker(str(store), first.pid, first.namesrv_addr, first.broker_addr, False)
    assert find_local_broker(store) == second
    assert resolve_namesrv(f"file://{store}") == first.namesrv_addr
    # another process finds the same broker
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        from rmq_eventstore.client import ensure_local_broker
        b = ensure_local_broker({str(store)!r})
        print(b.pid, b.namesrv_addr, b.started_by_us)
    """)], capture_output=True, text=True, env=ENV, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == [str(first.pid), first.namesrv_addr, "False"]
    assert _send_and_pull(first.namesrv_addr, "first", b"one") == b"one"
    log = (store / "logs" / "broker.log").read_text()
    assert log.count(" starts: ") == 1 and "serving" in log


def test_a_forked_worker_finds_the_broker_its_parent_started(stores: Callable[[str], Path]) -> None:
    """gunicorn --preload, Celery prefork: the parent started the broker, its forks must find it too."""
    store = stores("forked")
    b = ensure_local_broker(store, idle_exit=60)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        code = 1
        try:
            found = find_local_broker(store)
            again = ensure_local_broker(store, timeout=10)
            os.write(w, f"{found.pid if found else 0} {again.pid} {again.started_by_us}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    with os.fdopen(r) as f:
        out = f.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert out.split() == [str(b.pid), str(b.pid), "False"]


_CHILD = textwrap.dedent("""
    import json, os, sys, time
    from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer, ensure_local_broker
    store, idx, t0 = sys.argv[1], sys.argv[2], float(sys.argv[3])
    while time.time() < t0:
        time.sleep(0.002)
    b = ensure_local_broker(store, idle_exit=60)
    body = f"hello from {idx}".encode()
    with Producer(b.namesrv_addr, f"pg{idx}") as p, PullConsumer(b.namesrv_addr, f"cg{idx}") as c:
        r = p.send(Message("shared", body), queue_id=0)
        res = c.pull("shared", 0, r.queue_offset, max_nums=1, suspend_timeout_ms=0)
        assert res.status == FOUND, res.status
        got = res.messages[0].body.decode()
    print(json.dumps({"pid": b.pid, "namesrv": b.namesrv_addr, "ours": b.started_by_us, "got": got}))
""")


def test_eight_processes_at_once_start_exactly_one_broker(stores: Callable[[str], Path]) -> None:
    store = stores("fresh")
    t0 = time.time() + 1.5  # every child has imported the client by then: they all ask at once
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, str(store), str(i), repr(t0)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ENV) for i in range(8)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert sum(r["ours"] for r in results) == 1
    assert len({(r["pid"], r["namesrv"]) for r in results}) == 1
    assert sorted(r["got"] for r in results) == sorted(f"hello from {i}" for i in range(8))
    log = (store / "logs" / "broker.log").read_text()
    assert log.count(" starts: ") == 1, log
    assert _serve_pids(store) == [results[0]["pid"]]
    # all eight messages are in the one queue
    b = find_local_broker(store)
    assert b is not None and b.pid == results[0]["pid"]
    with PullConsumer(b.namesrv_addr, "check") as c:
        res = c.pull("shared", 0, 0, max_nums=32, suspend_timeout_ms=0)
        assert sorted(m.body.decode() for m in res.messages) == sorted(r["got"] for r in results)


def test_threads_at_once_start_exactly_one_broker(stores: Callable[[str], Path]) -> None:
    from concurrent.futures import ThreadPoolExecutor

    store = stores("threads")
    with ThreadPoolExecutor(6) as ex:
        got = list(ex.map(lambda _: ensure_local_broker(store, idle_exit=60), range(6)))
    assert sum(b.started_by_us for b in got) == 1
    assert len({(b.pid, b.namesrv_addr) for b in got}) == 1


def test_a_stale_announcement_is_ignored_and_replaced(stores: Callable[[str], Path]) -> None:
    store = stores("stale")
    store.mkdir()
    dead = subprocess.Popen(["true"])
    dead.wait()
    write_broker_file(store, pid=dead.pid, namesrv="127.0.0.1:1", broker="127.0.0.1:2", started_ms=1)
    assert find_local_broker(store) is None
    assert read_broker_file(store)["pid"] == dead.pid  # finding does not delete
    # a live pid whose name server does not answer (a reused pid) is not a broker either, and is kept
    write_broker_file(store, pid=os.getpid(), namesrv="127.0.0.1:1", broker="127.0.0.1:2", started_ms=1)
    assert find_local_broker(store) is None
    assert read_broker_file(store)["pid"] == os.getpid()
    b = ensure_local_broker(store, idle_exit=60)
    assert b.started_by_us and b.pid not in (dead.pid, os.getpid())
    assert read_broker_file(store)["pid"] == b.pid


def test_after_sigkill_the_next_caller_starts_a_new_broker_and_the_messages_are_there(
        stores: Callable[[str], Path]) -> None:
    store = stores("killed")
    first = ensure_local_broker(store, idle_exit=60)
    with Producer(first.namesrv_addr, "pg") as p:
        sent = [p.send(Message("durable", f"m{i}".encode()), queue_id=0) for i in range(20)]
    assert [s.queue_offset for s in sent] == list(range(20))
    os.kill(first.pid, signal.SIGKILL)
    assert _wait_dead(first.pid, 5)
    assert read_broker_file(store)["pid"] == first.pid  # left behind by the killed broker
    assert find_local_broker(store) is None
    second = ensure_local_broker(store, idle_exit=60)
    assert second.started_by_us and second.pid != first.pid
    with PullConsumer(second.namesrv_addr, "cg") as c:
        res = c.pull("durable", 0, 0, max_nums=32, suspend_timeout_ms=0)
        assert res.status == FOUND
        assert [m.body for m in res.messages] == [f"m{i}".encode() for i in range(20)]
        assert [m.msg_id for m in res.messages] == [s.offset_msg_id for s in sent]


def test_idle_exit(stores: Callable[[str], Path]) -> None:
    store = stores("idle")
    b = ensure_local_broker(store, idle_exit=1.5)
    assert _send_and_pull(b.namesrv_addr, "idle", b"x") == b"x"  # connections keep it; they close here
    assert _wait_dead(b.pid, 10)
    assert not (store / "broker.json").exists()
    assert not (store / "abort").exists()  # a clean shutdown
    log = (store / "logs" / "broker.log").read_text()
    assert "no client connection for 1.5 s (--idle-exit)" in log and "shutting down" in log
    again = ensure_local_broker(store, idle_exit=60)
    assert again.started_by_us and again.pid != b.pid


def test_stop_local_broker(stores: Callable[[str], Path]) -> None:
    store = stores("stop")
    assert stop_local_broker(store) is False  # nothing announced
    b = ensure_local_broker(store, idle_exit=60, broker_options={"flushDiskType": "SYNC_FLUSH",
                                                                  "transaction_timeout": 3000})
    assert "flushDiskType=SYNC_FLUSH" in (store / "broker.spawn.conf").read_text()
    assert stop_local_broker(store) is True
    assert not _pid_alive(b.pid)
    assert not (store / "broker.json").exists() and not (store / "abort").exists()
    assert stop_local_broker(store) is False


def test_stop_local_broker_stops_a_broker_too_busy_to_answer(stores: Callable[[str], Path]) -> None:
    """A broker that cannot answer the probe in time (here: stopped with SIGSTOP, as a loaded machine can
    starve it) is still stopped: its command line shows it serves the store. It gets SIGCONT after the probe
    gave up, handles the SIGTERM and exits cleanly."""
    store = stores("busy")
    b = ensure_local_broker(store, idle_exit=60)
    os.kill(b.pid, signal.SIGSTOP)
    resume = threading.Timer(PROBE_TIMEOUT + 1.0, os.kill, (b.pid, signal.SIGCONT))
    resume.start()
    try:
        t0 = time.monotonic()
        assert stop_local_broker(store, timeout=15) is True
        assert time.monotonic() - t0 >= PROBE_TIMEOUT  # it did ask first
    finally:
        resume.join()
    assert not _pid_alive(b.pid)
    assert not (store / "broker.json").exists()


def test_a_process_that_reused_the_pid_is_not_signalled(stores: Callable[[str], Path]) -> None:
    """An announcement whose pid now belongs to another process (not a `serve` of this store) that does not
    answer: nobody is signalled."""
    store = stores("reused")
    store.mkdir(parents=True)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_broker_file(str(store), pid=other.pid, namesrv="127.0.0.1:1", broker="127.0.0.1:2", started_ms=0)
        assert stop_local_broker(store, timeout=2) is False
        assert other.poll() is None  # still running: not signalled
    finally:
        other.kill()
        other.wait(10)


def test_bad_broker_options_fail_with_the_log(stores: Callable[[str], Path]) -> None:
    store = stores("badopt")
    with pytest.raises(LocalBrokerError, match=r"(?s)exited with code 2.*unknown setting 'noSuchSetting'"):
        ensure_local_broker(store, broker_options={"no_such_setting": 1}, timeout=20)


def test_an_embedded_broker_is_found_by_another_process(stores: Callable[[str], Path]) -> None:
    from rmq_eventstore.broker import serve_in_thread

    store = stores("embedded")
    with serve_in_thread(store) as rb:
        assert read_broker_file(store)["pid"] == os.getpid()
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
            from rmq_eventstore.client import FOUND, Message, Producer, PullConsumer, ensure_local_broker
            b = ensure_local_broker({str(store)!r})
            with Producer(b.namesrv_addr, "pg") as p, PullConsumer(b.namesrv_addr, "cg") as c:
                r = p.send(Message("emb", b"from afar"), queue_id=0)
                assert c.pull("emb", 0, r.queue_offset, suspend_timeout_ms=0).status == FOUND
            print(b.pid, b.namesrv_addr, b.started_by_us)
        """)], capture_output=True, text=True, env=ENV, timeout=30)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == [str(os.getpid()), rb.namesrv_address, "False"]
        assert not (store / "logs").exists()  # nothing was spawned
        with pytest.raises(LocalBrokerError, match="runs in this process"):
            stop_local_broker(store)
    assert not (store / "broker.json").exists()  # removed on close


def test_a_store_held_by_a_process_without_a_broker_is_a_clear_error(stores: Callable[[str], Path]) -> None:
    from rmq_eventstore.store import MessageStore

    store = stores("held")
    with MessageStore.open(store):
        with pytest.raises(LocalBrokerError) as e:
            ensure_local_broker(store, timeout=20)
    msg = str(e.value)
    assert "exited with code 2" in msg and "already open" in msg
    assert f"pid {os.getpid()}" in msg and "holds its lock file" in msg


def test_a_store_path_that_cannot_be_written_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(LocalBrokerError, match="cannot use .*a-file/store as a store directory"):
        ensure_local_broker(blocker / "store")
    if os.geteuid() == 0:
        return  # root writes anywhere: the permission case below cannot be shown
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o555)
    try:
        with pytest.raises(LocalBrokerError, match="(?i)permission denied"):
            ensure_local_broker(ro / "store")
    finally:
        ro.chmod(0o755)
