"""`rmq-eventstore`: the parser built from every command family's `COMMANDS`, and `main`."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys

from ..store.config_files import (
    ConfigFileError,
)
from ..store.index import IndexReadOnlyError
from ..store.mapped_file import StoreLoadError
from . import broker, group, repair, spark, store, topic
from .output import EXIT_ERROR, EXIT_OK, PROG, CliError, Command, describe_os_error, notice, path_parser

COMMANDS: tuple[Command, ...] = (*store.COMMANDS, *repair.COMMANDS, *broker.COMMANDS, *group.COMMANDS, *topic.COMMANDS,
                                 *spark.COMMANDS)

DESCRIPTION = (
    "Tools for RocketMQ-format store directories (ours or Apache RocketMQ's). Read-only commands "
    "(inspect, query, msg, dump, verify, spark) never write to, lock or truncate a store, so they are safe "
    "beside a running broker. Commands marked [writes] (recover, rebuild, serve) change the store and take "
    "its lock: a store open in another process (a broker, another tool) is refused, saying who holds it."
)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser: one subparser per command of every family."""
    parser = argparse.ArgumentParser(prog=PROG, description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    common = path_parser()
    for cmd in COMMANDS:
        parents = [common] if cmd.takes_path else []
        summary = f"[writes] {cmd.help}" if cmd.writes else cmd.help
        description = cmd.description or cmd.help
        if cmd.writes:
            description += " Writes to the store: takes its lock, so a store open elsewhere is refused."
        p = sub.add_parser(cmd.name, help=summary, description=description, parents=parents)
        cmd.configure(p)
        p.set_defaults(run=cmd.run)
    return parser


def _quiet_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the interpreter's final flush stays quiet."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)


def main(argv: list[str] | None = None) -> int:
    """Run `rmq-eventstore` with `argv` (default: the process arguments); returns the exit code."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # usage errors (exit 2, message printed) and --help (exit 0)
        return e.code if isinstance(e.code, int) else EXIT_ERROR
    run = getattr(args, "run", None)
    if run is None:
        parser.print_help(sys.stderr)
        return EXIT_ERROR
    try:
        return run(args)
    except BrokenPipeError:
        _quiet_stdout()  # `... | head`: the reader went away; that is not an error
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except CliError as e:
        notice(f"error: {e.message}")
        return e.code
    except (StoreLoadError, ConfigFileError, IndexReadOnlyError) as e:
        notice(f"error: {e}")
        return EXIT_ERROR
    except OSError as e:
        notice(f"error: {describe_os_error(e)}")
        return EXIT_ERROR
    except Exception as e:  # a bug or an unforeseen file state: still one line unless --debug
        if getattr(args, "debug", False):
            raise
        notice(f"error: unexpected {type(e).__name__}: {e} (run with --debug for a traceback)")
        return EXIT_ERROR
