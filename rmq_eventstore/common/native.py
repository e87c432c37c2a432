"""Which per-record loops the store runs: the C extension `rmq_eventstore._native` (issue 16) or the
pure-Python references beside each call site.

`NATIVE` is True when the extension is in use. `RMQ_EVENTSTORE_PURE=1` (anything but empty or 0, read
once at import) forces the Python loops; an extension that does not import (not built: no C compiler, or
a source checkout without `make`) gives the same, with a debug-level log line saying why. The codec binds
the `Message` slots (`_native.init`) before any record is encoded.
"""

from __future__ import annotations

import logging
import os
from types import ModuleType

log = logging.getLogger(__name__)


def _load() -> ModuleType | None:
    if os.environ.get("RMQ_EVENTSTORE_PURE", "0") not in ("", "0"):
        log.debug("RMQ_EVENTSTORE_PURE is set: the store uses its pure-Python record loops")
        return None
    try:
        from .. import _native
    except ImportError as e:
        log.debug("rmq_eventstore._native is not importable (%s): the store uses its pure-Python record loops", e)
        return None
    return _native


native = _load()
NATIVE: bool = native is not None
