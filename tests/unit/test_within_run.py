"""The interval within one run: a bootstrap over the point's requests, checked against resampling
by hand, per request class, with too few requests, and how the verdict words it."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrator.decide.trials import Point, TrialData
from orchestrator.metrics.records import RequestRecord
from orchestrator.metrics.summary import summarize_point
from orchestrator.metrics.within_run import LEAST, within_run

RNG = np.random.default_rng(7)


def record(i: int, tokens: int, cls: str = "main") -> RequestRecord:
    sent = i * 0.1
    first = sent + RNG.lognormal(np.log(0.05), 0.5)
    times = list(first + np.concatenate([[0.0], np.cumsum(RNG.lognormal(np.log(0.02), 0.4, tokens - 1))]))
    return RequestRecord(
        request_id=i,
        point=0,
        request_class=cls,
        intended_send_s=sent,
        sent_s=sent,
        input_tokens_target=8,
        output_tokens_target=tokens,
        chunk_times_s=times,
        chunk_tokens=[1] * tokens,
        done_s=times[-1],
        prompt_tokens=8,
        output_tokens=tokens,
    )


def by_hand(records, gaps: bool, q: float, resamples: int = 600) -> np.ndarray:
    """The bootstrap the slow way: resample whole requests, pool, take the percentile."""
    est = []
    for _ in range(resamples):
        chosen = [records[i] for i in RNG.integers(0, len(records), len(records))]
        if gaps:
            values = np.concatenate([np.diff(r.chunk_times_s) * 1e3 for r in chosen])
        else:
            values = np.array([(r.chunk_times_s[0] - r.sent_s) * 1e3 for r in chosen])
        est.append(np.percentile(values, q))
    return np.percentile(est, [2.5, 97.5])


@pytest.mark.parametrize("n, tokens", [(200, 16), (400, 80)])  # 400 x 79 gaps: the binned path
def test_the_interval_is_the_bootstrap_over_whole_requests(n, tokens):
    records = [record(i, tokens) for i in range(n)]
    got = within_run(records, ["ttft_ms_p50", "itl_ms_p99"])
    point = summarize_point(records)
    for key, gaps, q in (("ttft_ms_p50", False, 50), ("itl_ms_p99", True, 99)):
        lo, hi = got[f"{key}_within95_low"], got[f"{key}_within95_high"]
        assert lo <= point[key] <= hi
        want = by_hand(records, gaps, q)
        width = want[1] - want[0]
        assert lo == pytest.approx(want[0], abs=0.25 * width) and hi == pytest.approx(want[1], abs=0.25 * width)


def test_a_class_alone_and_too_few_requests_give_no_interval():
    records = [record(i, 8, "short" if i % 4 else "long") for i in range(40)]
    got = within_run(records, ["short/ttft_ms_mean", "long/itl_worst_ms_max", "long/ttft_ms_p99"])
    assert set(got) == {
        "short/ttft_ms_mean_within95_low",
        "short/ttft_ms_mean_within95_high",
        "long/itl_worst_ms_max_within95_low",
        "long/itl_worst_ms_max_within95_high",
        "long/ttft_ms_p99_within95_low",
        "long/ttft_ms_p99_within95_high",
    }
    assert within_run(records[: LEAST - 1]) == {}
    assert within_run(records, seed=3) == within_run(records, seed=3)  # the same seed, the same resamples
    with pytest.raises(ValueError, match="tokens_per_second"):
        within_run(records, ["tokens_per_second"])


def test_a_verdict_from_one_run_each_says_its_interval_is_within_that_run():
    from orchestrator.config.schema import ObjectiveSpec
    from orchestrator.decide.verdict import decide

    def trial(name, p99, lo, hi):
        metrics = {"ttft_ms_p99": p99, "ttft_ms_p99_within95_low": lo, "ttft_ms_p99_within95_high": hi}
        return TrialData(name, "FINISHED", {}, {}, [Point(0, "c4", {"concurrency": 4}, metrics)])

    v = decide([trial("a", 100.0, 90.0, 130.0), trial("b", 120.0, 100.0, 150.0)], ObjectiveSpec(minimize="ttft_ms_p99"))
    assert v.best.name == "a"
    assert "One run each: run-to-run noise was not measured" in v.headline
    assert "Within its one run ttft_ms_p99 lay in 90..130 (95%, over that run's requests)" in v.headline
    assert "not how far another run would land" in v.headline
