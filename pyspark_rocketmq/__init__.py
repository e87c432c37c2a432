"""The `rocketmq` Spark data source, found by name.

PySpark 4 looks through every installed top-level module whose name starts with `pyspark_` and registers
the `DefaultSource` it finds there for every SparkSession, so with rmq-eventstore installed
`spark.read.format("rocketmq")` and `spark.readStream.format("rocketmq")` work without calling
`rmq_eventstore.spark.register(spark)` first.
"""

from rmq_eventstore.spark.datasource import RocketMQDataSource as DefaultSource

__all__ = ["DefaultSource"]
