"""Consumer offsets as the broker serves them (`ConsumerOffsetManager`), over the store's
consumerOffset.json: commits go to memory at once and to the file every `flush_consumer_offset_interval`
and at shutdown, as RocketMQ does; queries answer RocketMQ's first-start rule."""

from __future__ import annotations

import logging
from collections.abc import Callable

from ..store import MessageStore
from ..store.config_files import ConsumerOffsetManager as ConsumerOffsetFile

log = logging.getLogger(__name__)


class ConsumerOffsetManager:
    """Offsets by (group, topic, queue); POP and transaction check-back keep theirs here too."""

    def __init__(self, file: ConsumerOffsetFile, store: MessageStore) -> None:
        self.file = file
        self.store = store
        # POP's checkpoint buffer: where the group's pops of a queue are (past the committed offset while
        # their checkpoints are in memory), -1 when none is buffered; set by the PopService
        self.pop_frontier: Callable[[str, str, int], int] = lambda group, topic, queue_id: -1

    def commit(self, group: str, topic: str, queue_id: int, offset: int) -> None:
        self.file.commit_offset(group, topic, queue_id, offset)

    def query(self, group: str, topic: str, queue_id: int) -> int | None:
        """The group's next offset (`QUERY_CONSUMER_OFFSET`): committed, else 0 for a queue that still
        starts at 0, else None (QUERY_NOT_FOUND). A POP group's offset counts what it popped: committed, or
        past the pops whose checkpoints are still in the buffer (their commit waits for the checkpoint)."""
        off = max(self.file.query_offset(group, topic, queue_id), self.pop_frontier(group, topic, queue_id))
        if off >= 0:
            return off
        if self.store.get_min_offset_in_queue(topic, queue_id) <= 0:
            return 0
        return None

    def persist(self) -> None:
        try:
            self.file.persist()
        except Exception:
            log.exception("could not persist consumerOffset.json")

    def encode(self) -> str:
        return self.file.encode(False)
