"""Spark faces of the store: the `rocketmq` data source (batch and streaming) and pipeline jobs.

Nothing here is imported by `rmq_eventstore` or `rmq_eventstore.store`; the submodules that need
pyspark (`datasource`, `source`, `stream`, `session`, `jobs`) import it; the command line loads it only when a job runs.
Install with the `spark` extra (pyspark 4.x, Java 17).
"""
