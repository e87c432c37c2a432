"""The `rmq-eventstore` command line: one module per command family (`store`: inspect, query, msg, dump;
`repair`: verify, recover, rebuild; `broker`: serve; `spark`: the Spark jobs), shared output helpers in
`output`, the parser and entry point in `app`. The command line knows the library; no library module
imports it."""

from .app import build_parser, main

__all__ = ["build_parser", "main"]
