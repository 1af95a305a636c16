"""The workload: request classes, their LoRA adapter mix, and the load points they are sent at;
a load point, the SLOs and the capacity search are in :mod:`.load`, the validity and fidelity
checks in :mod:`.validity`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from .base import ArrivalKind, StrictModel
from .load import SLO_METRIC, CapacitySpec, LoadPointSpec, SLOSpec
from .validity import FidelitySpec, ValiditySpec


class RequestClass(StrictModel):
    """One kind of request in a workload and where its prompts come from (``dataset``).

    * ``random``: prompts of ``input_tokens`` random tokens (``range_ratio`` spreads lengths);
    * ``vllm_random``: like ``random``, but each prompt is a run of consecutive token ids from a
      random start, as ``vllm bench serve --dataset-name random`` builds them (to reproduce its
      numbers: on a small vocabulary such prompts share leading blocks and hit the prefix cache);
    * ``shared_prefix``: one of ``num_groups`` fixed prefixes of ``prefix_tokens``, then
      ``input_tokens`` random tokens (prefix-caching labs);
    * ``sharegpt``: the first user turn of conversations in the ShareGPT file ``path``; output
      length from the first reply unless ``output_tokens`` is set; prompts longer than
      ``max_input_tokens`` are skipped.
    * ``multi_turn``: conversations of ``turns`` user turns of ``input_tokens`` random tokens
      each; every turn after the first resends the whole conversation so far (user turns and
      the server's actual replies), ``think_time_s`` after the previous reply ended. A load
      point's arrivals and ``num_requests`` count conversations; each turn is one record.

    A class with ``rate`` set is background traffic: it arrives on its own process
    (``arrival``) at that rate while each load point runs, whatever the point's setting.
    """

    dataset: Literal["random", "vllm_random", "shared_prefix", "sharegpt", "multi_turn"] = "random"
    input_tokens: PositiveInt | None = None
    output_tokens: PositiveInt | None = None
    range_ratio: float = Field(default=0.0, ge=0.0, lt=1.0, description="lengths drawn in [n(1-r), n(1+r)]")
    output_tokens_choices: list[PositiveInt] | None = Field(
        default=None,
        description="output lengths drawn uniformly from this list (week 7); output_tokens must be their maximum",
    )
    num_groups: PositiveInt | None = None
    prefix_tokens: PositiveInt | None = None
    path: str | None = None
    turns: PositiveInt | None = Field(default=None, description="multi_turn: user turns per conversation")
    think_time_s: float = Field(default=0.0, ge=0.0, description="multi_turn: pause between a reply and the next turn")
    max_input_tokens: PositiveInt = 1024
    max_output_tokens: PositiveInt = 1024
    weight: PositiveFloat = 1.0
    rate: PositiveFloat | None = None
    arrival: ArrivalKind = "poisson"
    burstiness: PositiveFloat = Field(default=1.0, description="gamma shape; <1 burstier, >1 smoother")

    @model_validator(mode="after")
    def _dataset_fields(self) -> RequestClass:
        need = {
            "random": ("input_tokens", "output_tokens"),
            "vllm_random": ("input_tokens", "output_tokens"),
            "shared_prefix": ("input_tokens", "output_tokens", "num_groups", "prefix_tokens"),
            "sharegpt": ("path",),
            "multi_turn": ("input_tokens", "output_tokens", "turns"),
        }[self.dataset]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dataset '{self.dataset}' needs {', '.join(missing)}")
        # keys this dataset never reads: an error, never silently ignored (issue 20)
        owners = {
            "num_groups": "shared_prefix",
            "prefix_tokens": "shared_prefix",
            "path": "sharegpt",
            "max_input_tokens": "sharegpt",
            "turns": "multi_turn",
            "think_time_s": "multi_turn",
        }
        dead = [
            k
            for k, owner in owners.items()
            if k in self.model_fields_set
            and self.dataset != owner
            and getattr(self, k) != type(self).model_fields[k].default
        ]
        if dead:
            raise ValueError(
                f"{', '.join(dead)}: not used by dataset '{self.dataset}' (only by "
                f"{', '.join(sorted({owners[k] for k in dead}))}); remove it or set dataset"
            )
        if self.rate is None and (self.arrival != "poisson" or self.burstiness != 1):
            raise ValueError(
                "'arrival' and 'burstiness' of a class apply to background traffic only (set 'rate'); "
                "a foreground class arrives as the load point says"
            )
        if self.burstiness != 1 and self.arrival != "gamma":
            raise ValueError(
                f"'burstiness' shapes gamma arrivals only (arrival is '{self.arrival}'): set arrival: gamma"
            )
        if self.output_tokens_choices is not None:
            if not self.output_tokens_choices:
                raise ValueError("output_tokens_choices: expected a non-empty list")
            if self.output_tokens != max(self.output_tokens_choices):
                raise ValueError(
                    f"output_tokens must be max(output_tokens_choices) = "
                    f"{max(self.output_tokens_choices)} (it bounds the context)"
                )
        return self

    def max_tokens(self) -> int:
        """Upper bound of prompt + output tokens of one request."""
        spread = 1 + self.range_ratio
        if self.dataset == "sharegpt":
            return self.max_input_tokens + (int((self.output_tokens or 0) * spread) or self.max_output_tokens)
        assert self.input_tokens is not None and self.output_tokens is not None
        per_turn = int(self.input_tokens * spread) + int(self.output_tokens * spread)
        if self.dataset == "multi_turn":
            assert self.turns is not None
            return self.turns * (per_turn + 2)  # + a separator between messages (completions API)
        return (self.prefix_tokens or 0) + per_turn


class AdapterMixSpec(StrictModel):
    """Multi-LoRA serving: which adapter each request names in ``model``. The ``active`` first
    of ``names`` (and the base model with ``include_base``) are drawn per request: all alike
    (``uniform``) or by rank (``zipf``: the i-th with weight 1/i^s), from a stream of their own,
    so the prompts are the same whatever the mix. A conversation keeps one adapter."""

    names: list[str] | None = Field(
        default=None, description="adapter names, most popular first; None: model.lora's, in order"
    )
    active: PositiveInt | None = Field(default=None, description="the first N names only (None: all)")
    popularity: Literal["uniform", "zipf"] = "uniform"
    zipf_s: PositiveFloat = Field(default=1.0, description="zipf: the i-th adapter's weight is 1/i^s")
    include_base: bool = Field(default=False, description="the base model as one more choice (the last)")

    @model_validator(mode="after")
    def _consistent(self) -> AdapterMixSpec:
        if self.names is not None:
            if not self.names:
                raise ValueError("adapters.names: expected at least one adapter name (or None: model.lora's)")
            dup = sorted({n for n in self.names if self.names.count(n) > 1})
            if dup:
                raise ValueError(f"adapters.names: {dup} appear more than once")
            if self.active is not None and self.active > len(self.names):
                raise ValueError(f"adapters.active {self.active}: only {len(self.names)} names")
        if self.zipf_s != type(self).model_fields["zipf_s"].default and self.popularity != "zipf":
            raise ValueError(f"adapters.zipf_s shapes popularity 'zipf' only (popularity is '{self.popularity}')")
        return self

    def chosen(self) -> list[str]:
        """The adapters drawn from, most popular first (``names`` resolved)."""
        assert self.names is not None, "adapters.names is filled from model.lora before the load is planned"
        return self.names[: self.active] if self.active is not None else list(self.names)

    def weights(self, n: int) -> list[float]:
        """The draw's weights of ``n`` choices (the base last, when included)."""
        if self.popularity == "zipf":
            return [1.0 / (i + 1) ** self.zipf_s for i in range(n)]
        return [1.0] * n


class WorkloadSpec(StrictModel):
    """Requests and the load points they are sent at."""

    name: str
    api: Literal["completions", "chat"] = "completions"
    classes: dict[str, RequestClass] = Field(min_length=1)
    load_points: list[LoadPointSpec] = Field(default_factory=list, description="fixed points, run first")
    replay: LoadPointSpec | None = Field(
        default=None,
        description="a trace replayed as the only load point (a trace load point's fields): set by a "
        "trace workload (workload=mooncake), it wins over load_points an experiment sets for its own workload",
    )
    capacity: CapacitySpec | None = Field(default=None, description="then an SLO capacity search (probes)")
    num_requests: PositiveInt | None = Field(default=None, description="default per load point")
    duration_s: PositiveFloat | None = Field(default=None, description="default per load point")
    warmup_requests: int = Field(default=2, ge=0)
    seed: int = 0
    ignore_eos: bool = True
    usage_per_chunk: bool = Field(
        default=False,
        description="ask for usage in every chunk (vLLM's continuous_usage_stats): exact tokens per chunk "
        "under speculative decoding, at a per-token cost on the server; otherwise a chunk counts one "
        "token and the final usage gives the total",
    )
    request_timeout_s: PositiveFloat = 300.0
    client_processes: PositiveInt | Literal["auto"] = Field(
        default="auto",
        description="client processes sharing each point's schedule and clock; their records merge "
        "into one table. auto: per point, from its planned chunk rate and the client's measured CPU "
        "per chunk, up to the trial's CPUs (platform.cpus_per_trial)",
    )
    client_nodes: PositiveInt | Literal["auto"] = Field(
        default="auto",
        description="Ray nodes the client sends each point from (>1: shards on other nodes of the "
        "cluster, one start instant, each node's clock offset measured and corrected). auto: more "
        "than this node only when a point needs more client processes than its CPUs allow, other "
        "nodes are alive and they reach the server",
    )
    slo: SLOSpec = Field(default_factory=SLOSpec)
    validity: ValiditySpec = Field(default_factory=ValiditySpec)
    fidelity: FidelitySpec = Field(default_factory=FidelitySpec)
    repeats: PositiveInt = Field(default=1, description="run each load point this many times (fresh requests each)")
    adapters: AdapterMixSpec | None = Field(default=None, description="requests spread over LoRA adapters")
    max_ci_rel_width: PositiveFloat = Field(
        default=0.2, description="flag a repeated point whose 95% CI half-width exceeds this fraction of the mean"
    )

    @model_validator(mode="before")
    @classmethod
    def _replay_is_the_load_point(cls, data: Any) -> Any:
        replay = data.get("replay") if isinstance(data, dict) else None
        if replay is None:
            return data
        if not isinstance(replay, dict) or replay.get("trace") is None:
            raise ValueError("replay: a trace load point (set replay.trace to the trace file)")
        return {**data, "load_points": [replay]}

    @model_validator(mode="after")
    def _stops_and_classes(self) -> WorkloadSpec:
        if not any(c.rate is None for c in self.classes.values()):
            raise ValueError("at least one request class must follow the load point (no 'rate' of its own)")
        if not self.load_points and self.capacity is None:
            raise ValueError("load_points is empty and there is no capacity search: nothing to measure")
        if self.capacity is not None:
            for key in self.capacity.slo:
                cls = SLO_METRIC.match(key).group("cls")  # type: ignore[union-attr]
                if cls is not None and cls not in self.classes:
                    raise ValueError(
                        f"capacity.slo.{key}: no request class '{cls}' (classes: {', '.join(self.classes)})"
                    )
            probe = self.capacity.probe(self.capacity.start)
            if (
                probe.trace is None
                and (probe.num_requests or self.num_requests or probe.duration_s or self.duration_s) is None
            ):
                raise ValueError("capacity probes have no stop: set num_requests or duration_s")
        for i, p in enumerate(self.load_points):
            if p.trace is None and (p.num_requests or self.num_requests or p.duration_s or self.duration_s) is None:
                raise ValueError(f"load_points[{i}] has no stop: set num_requests or duration_s")
            if p.rate == float("inf") and self.stop_of(p)[0] is None:
                raise ValueError(f"load_points[{i}]: rate inf sends everything at once and needs num_requests")
        return self

    def stop_of(self, point: LoadPointSpec) -> tuple[int | None, float | None]:
        """(num_requests, duration_s) in force for a point."""
        n = point.num_requests if point.num_requests is not None else self.num_requests
        d = point.duration_s if point.duration_s is not None else self.duration_s
        if point.num_requests is not None and point.duration_s is None:
            d = None
        if point.duration_s is not None and point.num_requests is None:
            n = None
        return n, d

    def max_request_tokens(self) -> int:
        return max(c.max_tokens() for c in self.classes.values())
