"""The static-batching baseline of weeks 4 and 7: HF ``generate()`` on the same prompts.

    python -m orchestrator.labs.static_baseline +experiment=continuous_batching [--batch-size 8]
    python -m orchestrator.labs.static_baseline +experiment=paged_attention variant=seqs_16 --batch-size 16

It composes the experiment's config exactly as ``python -m orchestrator`` does, draws the
same requests (same seed: same prompts and output lengths as the engine trials' first load
point), and runs them through ``transformers`` in fixed batches: every batch is padded to
its longest prompt and decodes until its longest output is done (ignore-EOS, greedy), the
way a static batch server works. All requests are queued at the start, as at ``rate: inf``.

Each decode step is timed (a stopping-criteria hook), so every request gets token instants
like a streamed one: TTFT, TPOT, ITL, E2E and throughput come out of the same summary code
as the engine trials. The result is saved under ``outputs/static_baseline/`` first, then
logged to the experiment's MLflow store as a run tagged ``run_kind=static_baseline``, next
to the engine trials, to compare in the UI.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from orchestrator.config import to_specs
from orchestrator.config.hashing import trial_hash
from orchestrator.config.metric_keys import M
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.resolvers import register
from orchestrator.config.schema import SweepSettings, TrialSpec
from orchestrator.loadgen import PromptFactory
from orchestrator.loadgen.client import PlannedRequest
from orchestrator.loadgen.plan import RequestPlanner, plan_point
from orchestrator.metrics.records import RequestRecord, records_to_parquet_bytes
from orchestrator.metrics.result import PointResult, TrialResult, save_result
from orchestrator.metrics.summary import summarize_point
from orchestrator.models import resolve_model, resolve_tokenizer


def compose(overrides: list[str]) -> tuple[TrialSpec, SweepSettings]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    register()
    with initialize_config_dir(config_dir=str(PROJECT_ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    return to_specs(cfg, overrides)  # the command line wins over the experiment's overlays, as in a sweep


def plan_requests(spec: TrialSpec, factory: PromptFactory) -> list[PlannedRequest]:
    """The first load point's requests, as the engine trials draw them."""
    w = spec.workload
    plan = plan_point(w, w.load_points[0], 0, RequestPlanner(w, factory), (spec.seed, w.seed))
    return plan.foreground


class StepClock:
    """A stopping criterion that never stops: it stamps the time of every generated token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> bool:
        self.times.append(time.perf_counter())
        return False


def run_static(
    model_path: str, tokenizer_path: str, requests: list[PlannedRequest], batch_size: int, dtype: str = "float32"
) -> tuple[list[RequestRecord], dict[str, float]]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, StoppingCriteriaList

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(tokenizer_path)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    model = AutoModelForCausalLM.from_pretrained(model_path, torch_dtype=getattr(torch, dtype))
    model.eval()
    records: list[RequestRecord] = []
    generated = useful = 0
    t0 = time.perf_counter()
    for start in range(0, len(requests), batch_size):
        batch = requests[start : start + batch_size]
        longest = max(r.output_tokens for r in batch)
        enc = tok([r.prompt for r in batch], return_tensors="pt", padding=True, add_special_tokens=True)
        clock = StepClock()
        with torch.inference_mode():
            model.generate(
                **enc,
                max_new_tokens=longest,
                min_new_tokens=longest,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        steps = clock.times[:longest]
        generated += longest * len(batch)
        for r in batch:
            useful += r.output_tokens
            rec = RequestRecord(
                request_id=r.request_id,
                point=0,
                request_class=r.request_class,
                intended_send_s=t0,
                sent_s=t0,
                input_tokens_target=r.input_tokens,
                output_tokens_target=r.output_tokens,
                prompt_tokens=int(enc["attention_mask"][0].numel()),
                output_tokens=r.output_tokens,
            )
            rec.chunk_times_s = steps[: r.output_tokens]
            rec.chunk_tokens = [1] * len(rec.chunk_times_s)
            rec.done_s = rec.chunk_times_s[-1] if rec.chunk_times_s else time.perf_counter()
            records.append(rec)
        print(
            f"batch {start // batch_size + 1}/{-(-len(requests) // batch_size)}: {len(batch)} requests, "
            f"{longest} steps, {time.perf_counter() - t0:.1f}s elapsed",
            flush=True,
        )
    extra = {"padding_waste": 1 - useful / max(generated, 1), "batch_size": float(batch_size)}
    return records, extra


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--no-mlflow", action="store_true", help="only write the result to disk")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. +experiment=continuous_batching")
    a = ap.parse_args(argv)
    spec, settings = compose(a.overrides)
    if spec.model.source == "hub" and spec.platform.device == "cpu":
        sys.exit("the static baseline runs the CPU platform's local model; use a local model path")
    model_path = resolve_model(spec.model)
    tokenizer_path = resolve_tokenizer(spec.model, model_path)
    requests = plan_requests(spec, PromptFactory(tokenizer_path))
    dtype = spec.platform.dtype if spec.platform.dtype != "auto" else "float32"
    print(
        f"static baseline: {len(requests)} requests of {spec.workload.name} ({spec.experiment}), "
        f"HF generate() in batches of {a.batch_size}, {dtype}",
        flush=True,
    )
    started = time.time()
    records, extra = run_static(model_path, tokenizer_path, requests, a.batch_size, dtype)
    metrics = {**summarize_point(records, spec.workload.slo), **extra}
    point = PointResult(
        index=0, label=f"static_bs{a.batch_size}", setting={"batch_size": a.batch_size}, metrics=metrics
    )
    spec_json = spec.model_dump(mode="json")
    spec_json["engine"] = {"name": "hf_static", "batch_size": a.batch_size, "dtype": dtype}
    result = TrialResult(
        trial_hash=f"static-{trial_hash(spec)}-bs{a.batch_size}"[:40],
        experiment=spec.experiment,
        variant=f"static_bs{a.batch_size}",
        overrides=a.overrides,
        spec=spec_json,
        status="FINISHED",
        started_at=started,
        ended_at=time.time(),
        engine_version=f"transformers=={_version('transformers')}",
        points=[point],
        metrics={M.REQUESTS_TOTAL: float(len(records))},
        records_parquet=records_to_parquet_bytes(records),
    )
    out = PROJECT_ROOT / "outputs" / "static_baseline" / spec.experiment / time.strftime("%Y-%m-%d_%H-%M-%S")
    d = save_result(result, out)
    print(
        f"tokens/s {metrics[M.TOKENS_PER_SECOND]:.1f}, ttft p50 {metrics.get(M.TTFT_MS_P50, float('nan')):.0f} ms, "
        f"e2e p50 {metrics.get(M.E2E_MS_P50, float('nan')):.0f} ms, padding waste {extra['padding_waste']:.0%}; "
        f"saved in {d}",
        flush=True,
    )
    if not a.no_mlflow:
        from orchestrator.tracking import MlflowTracker

        tracking = settings.tracking
        tracker = MlflowTracker(tracking.uri, tracking.experiment_name or spec.experiment)
        tracker.log_trial(result, d, {"run_kind": "static_baseline"})
        print(f"MLflow: experiment '{spec.experiment}' at {tracking.uri}", flush=True)


def _version(dist: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "unknown"


if __name__ == "__main__":
    main()
