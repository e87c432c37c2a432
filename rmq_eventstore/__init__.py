"""rmq_eventstore: an event-sourcing persistence backend built on Apache RocketMQ's storage engine.

The store (`rmq_eventstore.store`) reads and writes the on-disk format of Apache RocketMQ 5.x byte for
byte; the framework faces (Django, Celery, Spark, the command line) sit on top of it.
"""

__version__ = "0.1.0"
