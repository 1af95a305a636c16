"""Records (Arrow schema), derived latencies and summaries, Prometheus deltas, resource sampling."""

from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes, records_to_table
from orchestrator.metrics.summary import summarize_by_class, summarize_point

__all__ = ["RequestRecord", "records_to_parquet_bytes", "records_to_table", "summarize_by_class", "summarize_point"]
