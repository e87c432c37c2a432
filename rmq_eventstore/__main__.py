"""`python -m rmq_eventstore`: the `rmq-eventstore` command-line tool (see `rmq_eventstore.cli`)."""

from rmq_eventstore.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
