"""Fixtures of the Django face's tests: a fresh store (embedded broker) per test or per module."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.test import override_settings

from rmq_eventstore.django.connection import EventStore, close_embedded_brokers, stores

# small files (a test store would otherwise preallocate a 1 GiB commitlog segment) and quick check-backs
BROKER = {"transaction_timeout": 1000, "transaction_check_interval": 500,
          "mapped_file_size_commit_log": 4 * 1024 * 1024, "mapped_file_size_consume_queue": 20 * 10_000,
          "max_hash_slot_num": 4096, "max_index_num": 16_384}


@contextlib.contextmanager
def store_at(path: Path, **options: Any) -> Iterator[EventStore]:
    """RMQ_EVENTSTORE's default alias on a new store directory, served by an embedded broker."""
    conf = {"default": {"URL": f"file://{path}", "OPTIONS": {
        "MODE": "embedded", "PRODUCER_GROUP": "django_tests", "BROKER": dict(BROKER), **options}}}
    with override_settings(RMQ_EVENTSTORE=conf):
        try:
            yield stores["default"]
        finally:
            stores.close_all()
            close_embedded_brokers()


@pytest.fixture
def event_store(tmp_path: Path) -> Iterator[EventStore]:
    with store_at(tmp_path / "store") as s:
        yield s


@pytest.fixture(scope="module")
def module_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EventStore]:
    with store_at(tmp_path_factory.mktemp("store")) as s:
        yield s
