"""TransientStorePool: the write buffers of RocketMQ's `transientStorePoolEnable` mode (spec §5.5).

With the pool, commitlog appends go into an off-mapping buffer of one file's size; the commit service
(`CommitRealTimeService`) copies them into the file and the flush service forces them. Appends then never
touch the mapping (no page faults or mmap-dirtied folios under the put lock), and readers see only
committed bytes.
"""

from __future__ import annotations

import collections
import logging
import mmap
import threading

log = logging.getLogger(__name__)


class TransientStorePool:
    """A fixed number of file-sized write buffers, lent to new commitlog files and returned once committed.

    Buffers are anonymous private mappings: the kernel gives them pages lazily, so an idle pool costs
    address space, not memory (RocketMQ allocates direct ByteBuffers and mlocks them; Python cannot
    lock a buffer it does not own, so pages are faulted in on first use instead).
    """

    def __init__(self, pool_size: int, file_size: int) -> None:
        if pool_size <= 0:
            raise ValueError(f"transient_store_pool_size must be positive, not {pool_size}")
        self.pool_size = pool_size
        self.file_size = file_size
        self._buffers: collections.deque[mmap.mmap] = collections.deque()
        self._lock = threading.Lock()
        self._initialized = False

    def init(self) -> None:
        """Allocate the buffers (`TransientStorePool.init`)."""
        with self._lock:
            if self._initialized:
                return
            for _ in range(self.pool_size):
                self._buffers.append(mmap.mmap(-1, self.file_size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
            self._initialized = True

    def borrow_buffer(self) -> mmap.mmap | None:
        """A free buffer, or None (and a warning) when every buffer is lent out."""
        with self._lock:
            if not self._initialized:
                raise RuntimeError("TransientStorePool.init() was not called")
            buf = self._buffers.popleft() if self._buffers else None
            remaining = len(self._buffers)
        if buf is not None and remaining < self.pool_size * 0.4:
            log.warning("transient store pool only has %d buffers left", remaining)
        return buf

    def return_buffer(self, buf: mmap.mmap | bytearray) -> None:
        """Give a buffer back (its old bytes stay; commits only copy what was written since)."""
        with self._lock:
            if not isinstance(buf, mmap.mmap) or buf.closed:
                return
            if self._initialized:
                self._buffers.append(buf)
                return
        try:
            buf.close()  # the pool was destroyed while this buffer was lent out
        except BufferError:
            pass

    def available_buffer_nums(self) -> int:
        """Free buffers (`availableBufferNums`)."""
        with self._lock:
            return len(self._buffers)

    def destroy(self) -> None:
        """Unmap the free buffers (`TransientStorePool.destroy`); lent ones go when their files close."""
        with self._lock:
            while self._buffers:
                b = self._buffers.popleft()
                try:
                    b.close()
                except BufferError:
                    pass
            self._initialized = False
