"""Records (Arrow schema), derived latencies and summaries, Prometheus deltas, resource sampling.

Its names load on first use (PEP 562): ``orchestrator.metrics.nvml`` alone (GPU detection)
does not import pyarrow."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes, records_to_table
    from orchestrator.metrics.summary import summarize_by_class, summarize_point

__all__ = ["RequestRecord", "records_to_parquet_bytes", "records_to_table", "summarize_by_class", "summarize_point"]


def __getattr__(name: str) -> Any:
    if name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = "summary" if name.startswith("summarize") else "records"
    value = getattr(importlib.import_module(f"{__name__}.{home}"), name)
    globals()[name] = value
    return value
