"""When a load point's numbers cannot be trusted, and so the point is invalid: they describe the
client (:class:`ValiditySpec`) or another workload than the planned one (:class:`FidelitySpec`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, NonNegativeInt, PositiveFloat

from .base import PositiveShare, Share, StrictModel


class ValiditySpec(StrictModel):
    """When a load point's numbers describe the client rather than the server (point invalid).

    Lags are judged at p95: with a few dozen requests p99 is the single worst one, and one
    late send (e.g. the machine's other processes taking the core for a moment) is a blip,
    not a client that cannot keep up. p99 and max stay in the point's metrics.
    """

    max_send_lag_ms_p95: PositiveFloat = 10.0
    max_loop_lag_ms_p95: PositiveFloat = 10.0
    max_client_cpu_util: PositiveFloat = 0.9
    max_coalesced_share: Share = Field(
        default=0.2,
        description="share of token chunks read in one read with an earlier one (one instant for both) "
        "above which ITL describes the client's reads, not the server",
    )
    min_rate_ratio: PositiveShare = Field(default=0.98, description="achieved / scheduled rate")
    max_stream_wait_share: Share = Field(
        default=0.01,
        description="share of a closed loop's stream time spent waiting for requests past the plan "
        "(no request in flight) above which the point held fewer streams than asked",
    )
    max_foreign_cpu_cores: PositiveFloat | Literal["auto"] | None = Field(
        default="auto",
        description="CPU cores busy outside the trial (neither its servers nor its client nor the sweep's own "
        "Ray and driver processes) above which the machine was shared and the point is INVALID; 'auto' = an "
        "eighth of the machine's cores, at least 0.25 (0.25 on 2 cores, 8 on 64); null = not judged",
    )


class FidelitySpec(StrictModel):
    """When a load point's numbers describe another workload than the planned one (point
    invalid; :mod:`orchestrator.metrics.fidelity`). Defaults: a tokenizer mismatch (tens of
    percent) or a server ignoring ``ignore_eos`` is caught, a BOS token or a chat template's
    few tokens are not."""

    prompt_tokens_slack: NonNegativeInt = Field(
        default=16,
        description="tokens the server may count beyond the plan (BOS, chat template) before the "
        "relative limit applies",
    )
    max_prompt_tokens_error: PositiveFloat = Field(
        default=0.1, description="median |server - plan| prompt tokens as a fraction of the plan"
    )
    max_output_tokens_off: Share = Field(
        default=0.05,
        description="fraction of requests whose completion tokens differ from the plan "
        "(with ignore_eos; without it, only longer ones count)",
    )
    max_unexpected_hit_rate: Share = Field(
        default=0.1, description="prefix-cache hit rate allowed on prompts that share no prefix"
    )
    min_hit_fraction: Share = Field(
        default=0.5,
        description="shared-prefix / multi-turn prompts with caching on: hit rate at least "
        "this fraction of what the workload implies",
    )
    max_preemptions_per_request: float = Field(default=0.1, ge=0)
    max_rejected_fraction: Share = Field(default=0.0, description="requests refused with HTTP 4xx")
    max_gap_ms: PositiveFloat | None = Field(
        default=50.0,
        description="client TTFT/ITL median above the top of the server histogram's bucket by "
        "more than this: the client or the network (null: report only)",
    )
