"""Request records: one request as the client saw it, raw monotonic instants only.

Latencies (TTFT, TPOT, ITL, E2E) are derived from these by pure functions in
:mod:`orchestrator.metrics.summary`. Records travel as an Arrow table / Parquet bytes.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

STATUS_OK = "ok"
STATUS_ERROR = "error"


@dataclass
class RequestRecord:
    """One request. All instants are ``time.monotonic()`` seconds on the client."""

    request_id: int
    point: int
    request_class: str
    intended_send_s: float  # when the schedule wanted it sent
    sent_s: float  # when the client actually sent it
    input_tokens_target: int
    output_tokens_target: int
    chunk_times_s: list[float] = field(default_factory=list)  # arrival of each content chunk
    chunk_tokens: list[int] = field(default_factory=list)  # output tokens carried by each chunk
    done_s: float | None = None  # stream finished (or failed)
    prompt_tokens: int | None = None  # server-reported usage
    output_tokens: int | None = None  # server-reported usage
    status: str = STATUS_OK
    error: str | None = None
    http_status: int | None = None
    repeat: int = 0  # which repetition of the load point (workload.repeats)
    conversation_id: int | None = None  # multi-turn: request_id of the conversation's first turn
    turn: int = 0  # multi-turn: 0 for the first user turn, 1 for the next, ...
    coalesced_chunks: int = 0  # token chunks read together with an earlier one (one instant for both)
    adapter: str | None = None  # the LoRA adapter the request named (workload.adapters); None: the base model
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache served (when it says)

    @property
    def ok(self) -> bool:
        return self.status == STATUS_OK and bool(self.chunk_times_s)


ARROW_SCHEMA = pa.schema(
    [
        ("request_id", pa.int64()),
        ("point", pa.int32()),
        ("request_class", pa.string()),
        ("intended_send_s", pa.float64()),
        ("sent_s", pa.float64()),
        ("input_tokens_target", pa.int32()),
        ("output_tokens_target", pa.int32()),
        ("chunk_times_s", pa.list_(pa.float64())),
        ("chunk_tokens", pa.list_(pa.int32())),
        ("done_s", pa.float64()),
        ("prompt_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("status", pa.string()),
        ("error", pa.string()),
        ("http_status", pa.int32()),
        ("repeat", pa.int32()),
        ("conversation_id", pa.int64()),
        ("turn", pa.int32()),
        ("coalesced_chunks", pa.int32()),
        ("adapter", pa.string()),
        ("cached_tokens", pa.int32()),
    ]
)


def records_to_table(records: Iterable[RequestRecord]) -> pa.Table:
    rows = [asdict(r) for r in records]
    return pa.Table.from_pylist(rows, schema=ARROW_SCHEMA)


def table_to_records(table: pa.Table) -> list[RequestRecord]:
    """Records of a table; columns added since it was written take their defaults."""
    known = {f.name for f in ARROW_SCHEMA}
    return [RequestRecord(**{k: v for k, v in row.items() if k in known}) for row in table.to_pylist()]


def records_to_parquet_bytes(records: Sequence[RequestRecord]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(records_to_table(records), buf, compression="zstd")
    return buf.getvalue()


def parquet_bytes_to_table(data: bytes) -> pa.Table:
    return pq.read_table(io.BytesIO(data))
