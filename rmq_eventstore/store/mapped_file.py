"""MappedFile and MappedFileQueue: fixed-size memory-mapped segment files named by their start offset.

The commitlog and every consume queue are a `MappedFileQueue`: files of one size whose names are the
20-digit absolute offset of their first byte (spec §5). A file knows three positions: bytes written
(`wrote_position`), committed (only differs with a write buffer) and flushed to disk.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import time
from typing import TYPE_CHECKING

from ..common.native import native
from .fsutil import fsync_directory

# MappedFile.warm's page population without the GIL; None without the native core or once the kernel said
# it has no MADV_POPULATE_WRITE
_populate = getattr(native, "populate", None)

if TYPE_CHECKING:
    from .transient_store_pool import TransientStorePool

log = logging.getLogger(__name__)

OS_PAGE_SIZE = 4096
FILE_NAME_DIGITS = 20


class StoreLoadError(RuntimeError):
    """A store directory that cannot be opened as it is (wrong file sizes, unreadable files)."""


def offset_to_file_name(offset: int) -> str:
    """`UtilAll.offset2FileName`: the decimal offset left-padded with zeros to 20 digits."""
    return f"{offset:020d}"


def prepare_segment_file(fd: int, file_size: int) -> None:
    """Give a new, empty segment file its full size (RocketMQ maps the full size, extending with zeros).

    The blocks are reserved with `posix_fallocate` (see the file-preparation × sync-call matrix in
    benchmarks/README.md): durable appends cost the same as on a sparse file, while a full disk shows up
    here as ENOSPC (CREATE_MAPPED_FILE_FAILED) instead of a SIGBUS on a later write through the mapping.
    Prefilling with write() is avoided: msync/fdatasync of mmap writes into such pages costs ~2 MiB of
    I/O per 4 KiB on this kernel. Filesystems without fallocate get a sparse file (ftruncate).
    """
    try:
        os.posix_fallocate(fd, 0, file_size)
    except OSError as e:
        if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
        os.ftruncate(fd, file_size)


class MappedFile:
    """One segment file mapped into memory, with its write / commit / flush positions.

    A file opened `read_only` maps only what exists and never writes, truncates or locks, so it can
    read a store that another process (a broker, Apache RocketMQ itself) is writing.
    """

    # the fields the native passes read and write are slots (`_native.dispatch_singles` and the single put
    # read them by offset, not by attribute look-up); everything else lives in the instance dict as before
    __slots__ = ("file_from_offset", "file_size", "read_only", "first_create_in_queue", "wrote_position",
                 "committed_position", "transient", "_write_view", "store_timestamp", "__dict__", "__weakref__")

    def __init__(self, path: str, file_size: int, read_only: bool = False) -> None:
        self.path = path
        self.file_name = os.path.basename(path)
        try:
            self.file_from_offset = int(self.file_name)
        except ValueError:
            raise StoreLoadError(f"{path}: a segment file name must be its decimal start offset") from None
        self.file_size = file_size
        self.read_only = read_only
        self.first_create_in_queue = False
        self.store_timestamp = 0  # store time of the last message appended (commitlog only)
        self._lock = threading.Lock()
        self.available = True
        if read_only:
            self._fd = os.open(path, os.O_RDONLY)
            actual = os.fstat(self._fd).st_size
            self.mapped_size = min(actual, file_size)
            self.mm = mmap.mmap(self._fd, self.mapped_size, access=mmap.ACCESS_READ) if self.mapped_size else None
        else:
            existed = os.path.exists(path)
            self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            actual = os.fstat(self._fd).st_size
            if actual == 0:
                try:
                    prepare_segment_file(self._fd, file_size)
                except OSError:
                    os.close(self._fd)
                    if not existed:
                        try:
                            os.unlink(path)
                        except OSError:
                            pass
                    raise
            elif actual != file_size:
                os.close(self._fd)
                raise StoreLoadError(f"{path} is {actual} bytes but the configured file size is {file_size}; "
                                     "open the store with the file size it was written with")
            self.mapped_size = file_size
            self.mm = mmap.mmap(self._fd, file_size, access=mmap.ACCESS_WRITE)
            if not existed:
                self._fsync_dir()
        self.view = memoryview(self.mm) if self.mm is not None else memoryview(b"")
        self.wrote_position = 0
        self.committed_position = 0
        self.flushed_position = 0
        self.warmed_position = 0  # pages before it were faulted in ahead of the writer (`warm`)
        # Transient store pool (spec §5.5): appends go to `write_buffer`, `commit` copies them into the
        # file, and readers see only committed bytes. `transient` stays set after the buffer goes back to
        # the pool (the file is then fully committed).
        self.write_buffer: bytearray | mmap.mmap | None = None
        self._write_view: memoryview = self.view
        self.transient = False
        self._pool: TransientStorePool | None = None
        self._commit_lock = threading.Lock()

    def init_write_buffer(self, pool: TransientStorePool) -> bool:
        """Borrow a write buffer from `pool` for a new, empty file; False when the pool has none left."""
        buf = pool.borrow_buffer()
        if buf is None:
            return False
        self.write_buffer = buf
        self._write_view = memoryview(buf)
        self._pool = pool
        self.transient = True
        return True

    def _fsync_dir(self) -> None:
        fsync_directory(os.path.dirname(self.path))

    # -- positions -----------------------------------------------------------------------------
    def get_read_position(self) -> int:
        """Readers (and flush) see written bytes, or only committed ones with a write buffer."""
        return self.committed_position if self.transient else self.wrote_position

    def is_full(self) -> bool:
        return self.wrote_position >= self.file_size

    def set_positions(self, pos: int) -> None:
        self.wrote_position = self.committed_position = self.flushed_position = pos

    @property
    def end_offset(self) -> int:
        return self.file_from_offset + self.file_size

    # -- writing --------------------------------------------------------------------------------
    def append_message(self, data: bytes | bytearray | memoryview) -> bool:
        """Append at the write position if the bytes fit in the file; False when they do not."""
        n = len(data)
        w = self.wrote_position
        if w + n > self.file_size:
            return False
        if n >= 65536 and native is not None:
            native.copy_into(self._write_view, w, data)  # a batch: copied without the GIL
        else:
            self._write_view[w:w + n] = data
        self.wrote_position = w + n
        return True

    def write_at(self, pos: int, data: bytes | bytearray | memoryview) -> None:
        self._write_view[pos:pos + len(data)] = data

    def warm(self, until: int) -> int:
        """Fault in this file's pages from where the writer is (or where the last warm stopped) up to
        `until`, for writing, without the GIL (`_native.populate`): the put that first writes a page then
        finds it mapped instead of faulting it in (and zeroing it) inside the put lock. No byte changes.
        Returns the bytes done; 0 for a file written through a write buffer, a read-only file, or without
        the native core or the kernel's MADV_POPULATE_WRITE."""
        global _populate
        if _populate is None or self.transient or self.mm is None or not self.view or self.view.readonly:
            return 0
        start = max(self.warmed_position, self.wrote_position)
        until = min(until, self.file_size)
        if until <= start:
            return 0
        try:
            done = _populate(self.view, start, until)
        except (OSError, ValueError) as e:  # ENOMEM and the like: the writer faults its pages in as before
            log.warning("could not warm %s ahead of the writer: %s", self.path, e)
            _populate = None
            return 0
        if not done:  # the kernel has no MADV_POPULATE_WRITE (before Linux 5.14)
            _populate = None
            return 0
        self.warmed_position = until
        return until - start

    # -- commit (transient store pool) ------------------------------------------------------------
    def is_able_to_commit(self, least_pages: int) -> bool:
        """`DefaultMappedFile.isAbleToCommit`: the flush page rule applied to wrote vs committed."""
        commit = self.committed_position
        write = self.wrote_position
        if self.is_full() and write > commit:
            return True
        if least_pages > 0:
            return (write // OS_PAGE_SIZE - commit // OS_PAGE_SIZE) >= least_pages
        return write > commit

    def commit(self, least_pages: int = 0) -> int:
        """Copy written bytes from the write buffer into the file (`DefaultMappedFile.commit`).

        Without a write buffer everything written counts as committed. The copy is a pwrite into the
        page cache (RocketMQ writes the FileChannel), which releases the GIL and leaves no mmap-dirtied
        pages behind. A fully committed file gives its buffer back to the pool. Returns the committed
        position.
        """
        if self.write_buffer is None:
            if not self.transient:
                self.committed_position = self.wrote_position
            return self.committed_position
        with self._commit_lock:
            buf = self.write_buffer
            if buf is None:
                return self.committed_position
            if self.is_able_to_commit(least_pages):
                start = self.committed_position
                end = self.wrote_position
                if end > start:
                    chunk = self._write_view[start:end]
                    try:
                        done = 0
                        while done < end - start:
                            done += os.pwrite(self._fd, chunk[done:], start + done)
                    except (ValueError, OSError) as e:
                        log.error("commit of %s failed: %s", self.path, e)
                        return self.committed_position
                    finally:
                        chunk.release()
                    self.committed_position = end
            if self.committed_position >= self.file_size:
                self._release_write_buffer()
        return self.committed_position

    def _release_write_buffer(self) -> None:
        buf, pool = self.write_buffer, self._pool
        if buf is None:
            return
        self.write_buffer = None
        try:
            self._write_view.release()
        except (BufferError, ValueError):
            pass
        self._write_view = self.view
        if pool is not None:
            pool.return_buffer(buf)

    def is_able_to_flush(self, least_pages: int) -> bool:
        flush = self.flushed_position
        write = self.get_read_position()
        if self.is_full() and write > flush:
            return True
        if least_pages > 0:
            return (write // OS_PAGE_SIZE - flush // OS_PAGE_SIZE) >= least_pages
        return write > flush

    def flush(self, least_pages: int = 0) -> int:
        """Force written bytes to disk when the page rule allows it; returns the flushed position."""
        if self.read_only or self.mm is None:
            return self.flushed_position
        if self.is_able_to_flush(least_pages):
            with self._lock:
                value = self.get_read_position()
                if value > self.flushed_position:
                    try:
                        # fdatasync, not msync: it writes back the file's dirty pages (mmap writes
                        # included) and, unlike mmap.flush, releases the GIL while the disk works.
                        os.fdatasync(self._fd)
                    except (ValueError, OSError) as e:
                        if self.available:
                            log.error("flush of %s failed: %s", self.path, e)
                        # else: cleanup destroyed the file under this flush; nothing is left to force
                        return self.flushed_position
                self.flushed_position = value
        return self.flushed_position

    # -- reading --------------------------------------------------------------------------------
    def select_mapped_buffer(self, pos: int, size: int | None = None) -> memoryview | None:
        """A view of `[pos, pos+size)` (or up to the read position); None outside the readable bytes."""
        read_pos = self.get_read_position()
        try:
            if size is None:
                if 0 <= pos < read_pos:
                    return self.view[pos:read_pos]
                return None
            if pos >= 0 and pos + size <= read_pos:
                return self.view[pos:pos + size]
        except ValueError:  # the file was destroyed (cleanup) under this read
            return None
        return None

    def get_last_modified_timestamp(self) -> int:
        try:
            return int(os.stat(self.path).st_mtime * 1000)
        except OSError:
            return 0

    def refresh_read_only(self) -> None:
        """Re-map a read-only file that has grown (reading a store another process writes)."""
        if not self.read_only:
            return
        actual = min(os.fstat(self._fd).st_size, self.file_size)
        if actual > self.mapped_size:
            old = self.mm
            self.mm = mmap.mmap(self._fd, actual, access=mmap.ACCESS_READ)
            self.view = memoryview(self.mm)
            self.mapped_size = actual
            if old is not None:
                try:
                    old.close()
                except BufferError:
                    pass

    # -- lifecycle ------------------------------------------------------------------------------
    def close(self) -> None:
        """Unmap and close; views still held by readers keep the mapping alive until they drop."""
        self.available = False
        with self._commit_lock:
            self._release_write_buffer()
        try:
            self.view.release()
        except (BufferError, ValueError):
            pass
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass  # a reader still holds a view; the mapping goes away with it
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def destroy(self) -> bool:
        """Close and delete the file."""
        self.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        return True

    def truncate_to(self, size: int) -> None:
        """Shrink the file on disk (read-write files only); used to trim a file beyond recovery."""
        os.ftruncate(self._fd, size)

    def __repr__(self) -> str:
        return (f"MappedFile({self.file_name}, wrote={self.wrote_position}, "
                f"flushed={self.flushed_position}, size={self.file_size})")


class MappedFileQueue:
    """The ordered segment files of one directory (the commitlog or one consume queue).

    The file list is replaced, never mutated in place, so readers on other threads iterate a stable
    snapshot while the writer adds or removes files (RocketMQ uses a CopyOnWriteArrayList).
    """

    __slots__ = ("mapped_files", "__dict__", "__weakref__")  # a slot for `_native.dispatch_singles`, see MappedFile

    def __init__(self, store_path: str, mapped_file_size: int, read_only: bool = False,
                 transient_store_pool: TransientStorePool | None = None) -> None:
        self.store_path = store_path
        self.mapped_file_size = mapped_file_size
        self.read_only = read_only
        self.transient_store_pool = transient_store_pool
        self.mapped_files: list[MappedFile] = []
        self.flushed_where = 0
        self.committed_where = 0
        self.store_timestamp = 0
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()

    # -- loading --------------------------------------------------------------------------------
    def list_segment_files(self) -> list[str]:
        try:
            names = os.listdir(self.store_path)
        except FileNotFoundError:
            return []
        return sorted((n for n in names if n.isdigit()), key=int)

    def load(self) -> bool:
        """Map every segment file, sorted by name (`MappedFileQueue.doLoad`).

        A zero-length last file is deleted (a crash while creating it); any other size mismatch is an
        error, as in RocketMQ, except in read-only mode where the last file may still be growing.
        """
        names = self.list_segment_files()
        files: list[MappedFile] = []
        for i, name in enumerate(names):
            path = os.path.join(self.store_path, name)
            size = os.path.getsize(path)
            last = i == len(names) - 1
            if size != self.mapped_file_size:
                if last and size == 0 and not self.read_only:
                    log.warning("deleting empty last file %s", path)
                    os.unlink(path)
                    continue
                if not (self.read_only and last and size < self.mapped_file_size):
                    for f in files:
                        f.close()
                    raise StoreLoadError(
                        f"{path} is {size} bytes but the configured file size is {self.mapped_file_size}; "
                        "open the store with the file size it was written with")
            mf = MappedFile(path, self.mapped_file_size, read_only=self.read_only)
            mf.set_positions(mf.mapped_size if self.read_only else self.mapped_file_size)
            files.append(mf)
        self.mapped_files = files
        return True

    # -- finding --------------------------------------------------------------------------------
    def get_first_mapped_file(self) -> MappedFile | None:
        files = self.mapped_files
        return files[0] if files else None

    def get_last_mapped_file_or_none(self) -> MappedFile | None:
        files = self.mapped_files
        return files[-1] if files else None

    def get_last_mapped_file(self, start_offset: int = 0, need_create: bool = True) -> MappedFile | None:
        """The file to append to: the last one, or a new one when there is none or it is full."""
        files = self.mapped_files
        last = files[-1] if files else None
        if last is not None and not last.is_full():
            return last
        if not need_create or self.read_only:
            return last
        if last is None:
            create_offset = start_offset - (start_offset % self.mapped_file_size)
        else:
            create_offset = last.file_from_offset + self.mapped_file_size
        return self._create(create_offset, first=last is None)

    def _create(self, offset: int, first: bool) -> MappedFile:
        with self._lock:
            files = self.mapped_files
            if files and files[-1].file_from_offset >= offset:
                return files[-1]
            os.makedirs(self.store_path, exist_ok=True)
            mf = MappedFile(os.path.join(self.store_path, offset_to_file_name(offset)), self.mapped_file_size)
            if self.transient_store_pool is not None and not mf.init_write_buffer(self.transient_store_pool):
                log.warning("transient store pool has no buffer left: %s is written through the mapping",
                            mf.file_name)
            mf.first_create_in_queue = first
            self.mapped_files = files + [mf]
            return mf

    def find_mapped_file_by_offset(self, offset: int, return_first_on_not_found: bool = False) -> MappedFile | None:
        files = self.mapped_files
        if not files:
            return None
        first, last = files[0], files[-1]
        size = self.mapped_file_size
        if offset < first.file_from_offset or offset >= last.file_from_offset + size:
            return first if return_first_on_not_found else None
        idx = offset // size - first.file_from_offset // size
        if 0 <= idx < len(files):
            mf = files[idx]
            if mf.file_from_offset <= offset < mf.file_from_offset + size:
                return mf
        for mf in files:  # holes or disorder: linear scan
            if mf.file_from_offset <= offset < mf.file_from_offset + size:
                return mf
        return first if return_first_on_not_found else None

    # -- offsets --------------------------------------------------------------------------------
    def get_min_offset(self) -> int:
        files = self.mapped_files
        return files[0].file_from_offset if files else -1

    def get_max_offset(self) -> int:
        files = self.mapped_files
        if not files:
            return 0
        f = files[-1]  # its get_read_position(), inline: the dispatch asks for this a few times a send
        return f.file_from_offset + (f.committed_position if f.transient else f.wrote_position)

    def get_max_wrote_position(self) -> int:
        files = self.mapped_files
        return files[-1].file_from_offset + files[-1].wrote_position if files else 0

    def remain_how_many_data_to_flush(self) -> int:
        return self.get_max_offset() - self.flushed_where

    def roll_next_file(self, offset: int) -> int:
        return offset + self.mapped_file_size - offset % self.mapped_file_size

    def get_mapped_memory_size(self) -> int:
        return sum(f.file_size for f in self.mapped_files)

    # -- commit and flush -----------------------------------------------------------------------
    def commit(self, least_pages: int = 0) -> bool:
        """Commit the file holding `committed_where` (`MappedFileQueue.commit`); True when nothing moved."""
        with self._commit_lock:
            self._skip_deleted("committed_where")
            mf = self.find_mapped_file_by_offset(self.committed_where, self.committed_where == 0)
            if mf is None:
                return True
            offset = mf.commit(least_pages)
            where = mf.file_from_offset + offset
            result = where == self.committed_where
            self.committed_where = where
            return result

    def flush(self, least_pages: int = 0) -> bool:
        """Flush the file holding `flushed_where`; True when nothing moved (`MappedFileQueue.flush`)."""
        self._skip_deleted("flushed_where")
        mf = self.find_mapped_file_by_offset(self.flushed_where, self.flushed_where == 0)
        if mf is None:
            return True
        ts = mf.store_timestamp
        offset = mf.flush(least_pages)
        where = mf.file_from_offset + offset
        result = where == self.flushed_where
        self.flushed_where = where
        if least_pages == 0:
            self.store_timestamp = ts
        return result

    # -- truncation and deletion ----------------------------------------------------------------
    def truncate_dirty_files(self, offset: int) -> None:
        """Keep data up to `offset`: the file containing it is cut back, files after it are deleted."""
        keep: list[MappedFile] = []
        for mf in self.mapped_files:
            if mf.file_from_offset + self.mapped_file_size > offset:
                if offset >= mf.file_from_offset:
                    mf.set_positions(offset % self.mapped_file_size)
                    keep.append(mf)
                else:
                    mf.destroy()
            else:
                keep.append(mf)
        self.mapped_files = keep

    def delete_last_mapped_file(self) -> None:
        files = self.mapped_files
        if files:
            files[-1].destroy()
            self.mapped_files = files[:-1]

    def delete_expired_file_by_offset(self, min_phy_offset: int, unit_size: int) -> int:
        """Delete consume-queue files whose last unit points below `min_phy_offset` (never the last file)."""
        files = self.mapped_files
        deleted: list[MappedFile] = []
        for mf in files[:-1]:
            pos = self.mapped_file_size - unit_size
            buf = mf.select_mapped_buffer(pos, 8)
            if buf is None:
                break
            max_phy = int.from_bytes(buf, "big", signed=True)
            buf.release()
            if max_phy < min_phy_offset:
                mf.destroy()
                deleted.append(mf)
            else:
                break
        if deleted:
            self._remove_files(deleted)
        return len(deleted)

    def delete_expired_file_by_time(
        self, expired_time_ms: int, delete_files_interval_ms: int = 0, clean_immediately: bool = False,
        delete_file_batch_max: int = 10, now_ms: int | None = None, interval_forcibly_ms: int = 120_000,
    ) -> int:
        """Delete files older than `expired_time_ms`, oldest first, never the last, stopping at the
        first one still in use (`deleteExpiredFileByTime`).

        `interval_forcibly_ms` is RocketMQ's grace period for readers still holding a file; here a
        reader's memoryview keeps the mapping alive by itself (the file is unlinked at once, the pages
        go when the last view drops), so deletion never has to wait or be retried."""
        files = self.mapped_files
        now = int(time.time() * 1000) if now_ms is None else now_ms
        deleted: list[MappedFile] = []
        for mf in files[:-1]:
            if now >= mf.get_last_modified_timestamp() + expired_time_ms or clean_immediately:
                mf.destroy()
                deleted.append(mf)
                if len(deleted) >= delete_file_batch_max:
                    break
                if delete_files_interval_ms > 0:
                    time.sleep(delete_files_interval_ms / 1000.0)
            else:
                break
        if deleted:
            self._remove_files(deleted)
        return len(deleted)

    def _skip_deleted(self, attr: str) -> None:
        """A commit / flush position inside files cleanup already deleted (a forcible clean can outrun an
        ASYNC flush) moves to the first remaining file: deleted bytes need no flush, and without this
        the position would point at no file and never move again."""
        first = self.get_first_mapped_file()
        where = getattr(self, attr)
        if first is not None and 0 < where < first.file_from_offset:
            setattr(self, attr, first.file_from_offset)

    def _remove_files(self, deleted: list[MappedFile]) -> None:
        """Drop deleted files from the list under the lock `_create` takes, so a file the writer adds
        meanwhile (cleanup runs on its own thread) is never lost from the list."""
        gone = {id(f) for f in deleted}
        with self._lock:
            self.mapped_files = [f for f in self.mapped_files if id(f) not in gone]

    def refresh_read_only(self) -> None:
        """Pick up files and bytes another process added since `load` (read-only mode)."""
        if not self.read_only:
            return
        known = {f.file_name for f in self.mapped_files}
        files = list(self.mapped_files)
        if files:
            files[-1].refresh_read_only()
            files[-1].set_positions(files[-1].mapped_size)
        for name in self.list_segment_files():
            if name not in known and (not files or int(name) > files[-1].file_from_offset):
                mf = MappedFile(os.path.join(self.store_path, name), self.mapped_file_size, read_only=True)
                mf.set_positions(mf.mapped_size)
                files.append(mf)
        self.mapped_files = files

    def shutdown(self) -> None:
        for mf in self.mapped_files:
            mf.close()

    def destroy(self) -> None:
        for mf in self.mapped_files:
            mf.destroy()
        self.mapped_files = []
        self.flushed_where = 0
        self.committed_where = 0
        try:
            os.rmdir(self.store_path)
        except OSError:
            pass
