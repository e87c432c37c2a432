"""Small file-system helpers shared by the file kinds (segments, index files, config files)."""

from __future__ import annotations

import os


def fsync_directory(directory: str) -> None:
    """Make a file's creation or rename in `directory` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory or ".", os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
