"""Spark test fixtures: ONE session-scoped local SparkSession and session-scoped stores on real files.

The stores are written by our `MessageStore` with the small test geometry (64 KiB commitlog segments
that end in BLANK records), several topics, queues, keys and tags, IPv4 and IPv6 born hosts, a second
run with an IPv6 store host, a V2-magic record, empty and non-UTF-8 bodies, and a record whose
properties repeat a key.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from golden import GOLDEN_DIR

from rmq_eventstore.store import Message, MessageStore
from tests.conftest import SMALL_GEOMETRY

GOLDEN = GOLDEN_DIR
TOPICS = ("orders", "payments", "audit")
V2_TOPIC = "v2topic"  # written with V2 magic (2-byte topic length), forced


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    from rmq_eventstore.spark import jvm
    from rmq_eventstore.spark.session import local_session

    jvm.build()  # the JVM reader's jar goes on the classpath at JVM start (no-op without javac / up to date)
    session = local_session(master="local[2]", app_name="rmq-eventstore-tests", fast_jvm=True)
    yield session
    session.stop()


def write_messages(store: MessageStore, start: int, count: int) -> None:
    """`count` messages numbered from `start` across topics, queues, keys, tags and born hosts."""
    for i in range(start, start + count):
        topic = TOPICS[i % 3]
        born = "[2001:db8::7]:4321" if i % 5 == 0 else f"10.0.0.{i % 4 + 1}:5000{i % 3}"
        r = store.put_message(Message(
            topic=topic, body=f'{{"n": {i}, "k": "acct-{i % 7}"}}'.encode() * (1 + i % 4),
            tags=f"tag{i % 4}" if i % 6 else None, keys=[f"acct-{i % 7}", f"ref{i}"] if i % 9 else None,
            queue_id=i % 4, properties={"seq": str(i), "src": "test"}, born_host=born))
        assert r.is_ok(), r


@pytest.fixture(scope="session")
def engine_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A shut-down store root with ~15 commitlog segments written by our engine."""
    root = tmp_path_factory.mktemp("spark") / "store"
    with MessageStore.open(root, **SMALL_GEOMETRY) as store:
        write_messages(store, 0, 1500)
        for msg in (Message(topic=V2_TOPIC, body=b"v2 magic", keys="lk", force_v2=True),
                    Message(topic="orders", body=b"", tags="empty"),
                    Message(topic="orders", body=b"\xff\xfe not utf-8 \xc3", keys="bin"),
                    Message(topic="audit", body=b"dup",
                            properties_string="TAGS\x01first\x02KEYS\x01d1\x02TAGS\x01second\x02")):
            assert store.put_message(msg).is_ok()
        store.wait_for_dispatch()
    with MessageStore.open(root, **{**SMALL_GEOMETRY, "store_host": "[fe80::1:2]:10911"}) as store:
        write_messages(store, 1500, 300)
        store.wait_for_dispatch()
    return root


@pytest.fixture
def store_copy(engine_store: Path, tmp_path: Path) -> Path:
    """A private copy of `engine_store` a test may damage."""
    dst = tmp_path / "copy"
    shutil.copytree(engine_store, dst)
    return dst


@pytest.fixture(scope="session")
def golden_stream_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`store.bin` and `store-crc.bin` (record streams from offset 0) as one-segment commitlog directories."""
    out = {}
    for name in ("store.bin", "store-crc.bin"):
        d = tmp_path_factory.mktemp(name.replace(".", "-"))
        shutil.copy(GOLDEN / name, d / f"{0:020d}")
        out[name] = d
    return out
