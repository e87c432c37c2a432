"""`format("rocketmq")`: the data source Spark looks up by name, handing out the batch reader
(`source`) and the streaming reader (`stream`). Importing it needs pyspark; `pyspark_rocketmq` re-exports
it as `DefaultSource` so that any SparkSession finds it without `register()`."""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from . import decode
from .source import FORMAT, RocketMQPushdownReader, RocketMQReader, SourceError, normalise_options
from .stream import RocketMQStreamReader


def _called_for_pushdown() -> bool:
    """True when Spark's pushdown planner (which only runs with the switch on) asks for the reader."""
    frame = sys._getframe(1)
    for _ in range(6):
        if frame is None:
            return False
        if frame.f_code.co_filename.endswith("data_source_pushdown_filters.py"):
            return True
        frame = frame.f_back
    return False


class RocketMQDataSource(DataSource):
    """`format("rocketmq")`: the messages of a RocketMQ-format store directory as a DataFrame.

    Spark calls `pushFilters` only with `spark.sql.python.filterPushdown.enabled=true` and fails any read
    whose reader defines it while the switch is off, so `reader` hands out the pushdown reader only when
    Spark's pushdown planner asks (option `pushdown`: `auto` (default), `false` never pushes, `true`
    always returns the pushdown reader).
    """

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return decode.DDL

    def _path(self) -> str:
        path = normalise_options(self.options).get("path")
        if not path:
            raise SourceError('the rocketmq source needs a store path: spark.read.format("rocketmq").load(PATH)')
        return path

    def reader(self, schema: StructType) -> DataSourceReader:
        mode = str(normalise_options(self.options).get("pushdown", "auto")).lower()
        if mode not in ("auto", "true", "false"):
            raise SourceError(f"option pushdown={mode!r}: expected auto, true or false")
        cls = RocketMQReader
        if mode == "true" or (mode == "auto" and _called_for_pushdown()):
            cls = RocketMQPushdownReader
        return cls(self._path(), normalise_options(self.options))

    def streamReader(self, schema: StructType) -> Any:  # noqa: N802 - Spark's name
        return RocketMQStreamReader(self._path(), normalise_options(self.options))


def register(spark: Any) -> None:
    """Register the `rocketmq` format with a SparkSession."""
    spark.dataSource.register(RocketMQDataSource)
