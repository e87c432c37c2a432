"""Shared fixtures for the store tests: small-geometry `MessageStore`s on real files under `tmp_path`.

Every store opened through `open_store` is shut down by the fixture's finalizer (shutdown is idempotent,
so tests may also shut stores down themselves, e.g. to reopen the directory).
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from rmq_eventstore.store import GetMessageStatus, MessageExt, MessageStore
from rmq_eventstore.store import commitlog as commitlog_module

# No per-example deadline for property tests: these check results, not speed, and Hypothesis's default 200 ms
# deadline turns a slow moment of this shared 2-core machine into a failure (DeadlineExceeded). Tests that
# set their own `@settings` keep them.
settings.register_profile("rmq", deadline=None)
settings.load_profile("rmq")

# Small files so that commitlog segments, consume-queue files and index files roll in every test.
SMALL_GEOMETRY: dict[str, object] = {
    "mapped_file_size_commit_log": 64 * 1024,
    "mapped_file_size_consume_queue": 20 * 1000,
    "max_hash_slot_num": 1024,
    "max_index_num": 4096,
}


@pytest.fixture
def small_geometry() -> dict[str, object]:
    """The default test geometry (a fresh copy: tests may change it)."""
    return dict(SMALL_GEOMETRY)


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    """Root directory of the default store of a test (not created: opening the store creates it)."""
    return tmp_path / "store"


@pytest.fixture
def open_store(store_path: Path) -> Iterator[Callable[..., MessageStore]]:
    """`open_store(path=None, **config)`: open (load + start) a store with the small geometry, overridden
    by `config`; every store opened this way is shut down at teardown."""
    opened: list[MessageStore] = []

    def _open(path: str | os.PathLike[str] | None = None, **config: object) -> MessageStore:
        cfg = {**SMALL_GEOMETRY, **config}
        store = MessageStore.open(store_path if path is None else path, **cfg)
        opened.append(store)
        return store

    yield _open
    for store in reversed(opened):
        store.shutdown()


@pytest.fixture
def store(open_store: Callable[..., MessageStore]) -> MessageStore:
    """A running store on `store_path` with the small geometry."""
    return open_store()


class FakeClock:
    """A settable replacement for the commitlog's clock: store timestamps become `clock.now`."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> int:
        self.now += ms
        return self.now


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Pins the store time written into records (and the born time of messages without one)."""
    clock = FakeClock(1_700_000_000_000)
    monkeypatch.setattr(commitlog_module, "now_ms", clock)
    return clock


def _read_queue(store: MessageStore, topic: str, queue_id: int, start: int = 0,
                batch: int = 32) -> list[tuple[int, MessageExt]]:
    """Every (queue offset, message) of a queue from `start`, through `get_message` only."""
    out: list[tuple[int, MessageExt]] = []
    offset = start
    while True:
        r = store.get_message("test-group", topic, queue_id, offset, batch)
        if r.status != GetMessageStatus.FOUND:
            assert r.status in (GetMessageStatus.OFFSET_OVERFLOW_ONE, GetMessageStatus.NO_MESSAGE_IN_QUEUE), \
                (topic, queue_id, offset, r.status)
            return out
        assert r.next_begin_offset > offset
        out.extend(zip(r.message_queue_offsets, r.messages, strict=True))
        offset = r.next_begin_offset


@pytest.fixture
def read_queue() -> Callable[..., list[tuple[int, MessageExt]]]:
    """`read_queue(store, topic, queue_id, start=0, batch=32)`: the whole queue via `get_message`."""
    return _read_queue


def import_native():  # noqa: ANN201 - the extension module
    """`rmq_eventstore._native` for a test module that compares the C loops with their Python references; the
    module is skipped when the extension is not built, except under RMQ_EVENTSTORE_REQUIRE_NATIVE (CI's first
    pass), where a missing extension is an error."""
    try:
        from rmq_eventstore import _native
    except ImportError as e:  # not built
        if os.environ.get("RMQ_EVENTSTORE_REQUIRE_NATIVE", "0") not in ("", "0"):
            raise AssertionError(f"RMQ_EVENTSTORE_REQUIRE_NATIVE is set but the extension does not import: {e}") from e
        pytest.skip(f"rmq_eventstore._native is not built ({e}); `make native` builds it", allow_module_level=True)
    return _native


@pytest.fixture
def silent_peer() -> Iterator[str]:
    """A peer that accepts connections and never answers (nor closes them)."""
    srv = socket.create_server(("127.0.0.1", 0))
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(srv.accept()[0])
            except OSError:
                continue

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"127.0.0.1:{srv.getsockname()[1]}"
    finally:
        stop.set()
        t.join(5)
        for s in (*accepted, srv):
            s.close()


def stop_reput_thread(svc) -> None:
    """Stop a store's dispatch thread (without catching up) so that only the test dispatches."""
    svc._stopped.set()
    svc._wakeup.set()
    svc._thread.join(5)
    svc._thread = None
    svc._wakeup.clear()
    svc._signalled = False
