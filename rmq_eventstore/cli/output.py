"""What every command family shares: exit codes, `CliError`, the `Command` record, tables and key/value
lines for people, JSON for machines, progress bars on a terminal, and the options of commands that take a
store `PATH`."""

from __future__ import annotations

import argparse
import sys
import unicodedata
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from ..common import codec
from ..store.inspection import iso_local

try:  # a declared dependency; the tool still works (without progress bars) if it is missing
    from tqdm import tqdm as _tqdm
except ImportError:  # pragma: no cover - exercised only without tqdm installed
    _tqdm = None

PROG = "rmq-eventstore"
EXIT_OK = 0
EXIT_DAMAGE = 1
EXIT_ERROR = 2

PROGRESS_STEP = 1 << 20  # update a progress bar at most once per MiB scanned
_SYS_FLAG_NAMES = ((codec.COMPRESSED_FLAG, "COMPRESSED"), (codec.MULTI_TAGS_FLAG, "MULTI_TAGS"),
                   (codec.BORNHOST_V6_FLAG, "BORNHOST_V6"), (codec.STOREHOSTADDRESS_V6_FLAG, "STOREHOST_V6"),
                   (codec.NEED_UNWRAP_FLAG, "NEED_UNWRAP"), (codec.INNER_BATCH_FLAG, "INNER_BATCH"))
_TX_NAMES = {codec.TRANSACTION_PREPARED_TYPE: "TRANSACTION_PREPARED",
             codec.TRANSACTION_COMMIT_TYPE: "TRANSACTION_COMMIT",
             codec.TRANSACTION_ROLLBACK_TYPE: "TRANSACTION_ROLLBACK"}


class CliError(Exception):
    """An error reported as one line on stderr with exit code `code` (2 unless said otherwise)."""

    def __init__(self, message: str, code: int = EXIT_ERROR) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


@dataclass(frozen=True)
class Command:
    """One subcommand: `configure` adds its arguments to its subparser, `run` does the work (exit code)."""

    name: str
    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str = ""
    takes_path: bool = True  # a `PATH` store argument (and the common store options) first
    writes: bool = False  # changes the store (and so takes its lock); read-only otherwise


# ---------------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------------


def with_time(ms: int) -> str:
    iso = iso_local(ms)
    return f"{ms} ({iso})" if iso else str(ms)


def sys_flag_names(sys_flag: int) -> list[str]:
    """Names of the sysFlag bits set in `sys_flag` (MessageSysFlag)."""
    names = [name for bit, name in _SYS_FLAG_NAMES if sys_flag & bit]
    tx = codec.transaction_value(sys_flag)
    if tx:
        names.append(_TX_NAMES[tx])
    return names


def describe_os_error(e: OSError) -> str:
    if e.filename and e.strerror:
        return f"{e.filename}: {e.strerror}"
    return str(e)


def stdout() -> TextIO:
    return sys.stdout


def notice(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def display_width(text: str) -> int:
    """Terminal columns `text` takes (East Asian wide and fullwidth characters take two)."""
    if text.isascii():
        return len(text)
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 0 if unicodedata.combining(c) else 1
               for c in text)


def _clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` columns, marked with `...` when cut."""
    if display_width(text) <= limit:
        return text
    out = ""
    for c in text:
        if display_width(out + c) > limit - 3:
            break
        out += c
    return out + "..."


def _pad(text: str, width: int, right: bool) -> str:
    fill = " " * max(width - display_width(text), 0)
    return fill + text if right else text + fill


def table(headers: Sequence[str], rows: Iterable[Sequence[object]], indent: str = "  ",
          max_cell: int = 48) -> list[str]:
    """Lines of an aligned text table: integer columns right-aligned, everything else left-aligned.

    Cells wider than `max_cell` columns are cut (the JSON output of every command has the full values).
    """
    rows = list(rows)
    cells = [[_clip("-" if v is None or v == "" else str(v), max_cell) for v in row] for row in rows]
    widths = [max([display_width(h)] + [display_width(r[i]) for r in cells]) for i, h in enumerate(headers)]
    numeric = [bool(rows) and all(isinstance(r[i], int) and not isinstance(r[i], bool) for r in rows)
               for i in range(len(headers))]

    def line(values: Sequence[str], header: bool = False) -> str:
        parts = [_pad(v, w, numeric[i] and not header) for i, (v, w) in enumerate(zip(values, widths, strict=True))]
        return (indent + "  ".join(parts)).rstrip()

    return [line(list(headers), True)] + [line(r) for r in cells]


def key_values(pairs: Iterable[tuple[str, object]], indent: str = "  ") -> list[str]:
    """Lines of `key  value` pairs with the values aligned."""
    pairs = list(pairs)
    width = max((len(k) for k, _ in pairs), default=0)
    return [(f"{indent}{k.ljust(width)}  {'-' if v is None else v}").rstrip() for k, v in pairs]


class _NoProgress:
    """Stand-in for a disabled tqdm bar."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class Progress:
    """A bytes-scanned progress bar on stderr (tqdm), shown only when enabled (stderr is a TTY).

    Updates are batched to one per `PROGRESS_STEP` bytes so that a per-record call costs nothing. The bar
    appears with the first update: a run that never advances it (a query answered by the index, a dump
    through the consume queues) shows none.
    """

    def __init__(self, total: int, desc: str, enabled: bool) -> None:
        self._pending = 0
        self._total = total
        self._desc = desc
        self._enabled = enabled and _tqdm is not None and total > 0
        self._bar: Any = None

    def _update(self, n: int) -> None:
        if self._bar is None:
            if not self._enabled:
                self._bar = _NoProgress()
            else:
                self._bar = _tqdm(total=self._total, desc=self._desc, unit="B", unit_scale=True,
                                  unit_divisor=1024, file=sys.stderr, leave=False, dynamic_ncols=True,
                                  mininterval=0.25)
        self._bar.update(n)

    def advance(self, n: int) -> None:
        self._pending += n
        if self._pending >= PROGRESS_STEP:
            self._update(self._pending)
            self._pending = 0

    def close(self) -> None:
        if self._pending:
            self._update(self._pending)
            self._pending = 0
        if self._bar is not None:
            self._bar.close()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress_enabled(args: argparse.Namespace) -> bool:
    if getattr(args, "no_progress", False):
        return False
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def path_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("path", metavar="PATH", help="store root, or a directory of commitlog segment files")
    common.add_argument("--commitlog-file-size", type=int, metavar="BYTES",
                        help="commitlog segment size (default: inferred from the files)")
    common.add_argument("--no-progress", action="store_true", help="no progress bar, even on a terminal")
    common.add_argument("--debug", action="store_true", help="show tracebacks for unexpected errors")
    return common
