"""The load generator against the in-repo fake server: timing, concurrency, rate, errors, prompts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from orchestrator.config.schema import WorkloadSpec
from orchestrator.loadgen import Endpoint, PromptFactory, run_each, run_points
from orchestrator.metrics.summary import latency_of, summarize_point
from testkit.fake_openai_server import FakeOpenAIServer, IsolatedFakeServer, Script

pytestmark = pytest.mark.measures


@pytest.fixture(scope="module")
def factory(tiny_model_dir):
    return PromptFactory(str(tiny_model_dir))


def workload(**kw):
    base = {
        "name": "t",
        "classes": {"a": {"input_tokens": 32, "output_tokens": 8}},
        "load_points": [{"concurrency": 2}],
        "num_requests": 6,
        "warmup_requests": 1,
    }
    base.update(kw)
    return WorkloadSpec.model_validate(base)


def test_prompts_have_exact_token_counts(factory):
    rng = np.random.default_rng(0)
    for n in (1, 7, 64, 500, 1536):
        assert factory.count(factory.prompt(n, rng)) == n


def test_vllm_style_prompts_share_prefixes_like_vllms_client(factory):
    # vLLM's client's random dataset: consecutive ids from a random start, then its own
    # decode/re-encode loop (a token or two over the target at times, as vLLM's are). On the
    # tiny model's small vocabulary two of 64 such prompts often start alike; ours never do.
    rng = np.random.default_rng(0)
    ramps = [factory.ramp_prompt(64, rng) for _ in range(64)]
    assert all(64 <= factory.count(p) <= 66 for p in ramps)
    assert factory.ramp_prompt(64, np.random.default_rng(5)) == factory.ramp_prompt(64, np.random.default_rng(5))
    heads = [tuple(factory.encode(p)[:16]) for p in ramps]
    assert len(set(heads)) < len(heads)
    plain = [tuple(factory.encode(factory.prompt(64, rng))[:16]) for _ in range(64)]
    assert len(set(plain)) == len(plain)


def test_same_seed_same_prompts(factory):
    a = factory.prompt(50, np.random.default_rng(3))
    b = factory.prompt(50, np.random.default_rng(3))
    assert a == b


def late_by(stats: dict[str, float]) -> float:
    """How late (s) this client said its event loop woke, at worst, over the point: a process stall
    (another process on the core, the VM's hypervisor) delays every read by as much, and the
    client reports it. A timing check allows 20 ms of loopback and scheduling, and what the client
    said; how accurate the client is on a quiet machine is benchmarks/client_fidelity.py's table."""
    return 0.02 + stats["loop_lag_ms_max"] / 1e3


def test_records_match_scripted_timing(factory):
    # The server in its own process keeps the truth (when each request arrived, when each chunk
    # was written) on the same monotonic clock as the client: each measure is judged against it.
    with IsolatedFakeServer(Script(ttft_s=0.05, itl_s=0.02)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), workload(), factory, seed=0)
        truth = srv.truth.by_request
    records, slack = run.records, late_by(run.client)
    assert len(records) == 6 and all(r.ok for r in records)
    for r in records:
        lat = latency_of(r)
        assert lat.output_tokens == 8 and len(r.chunk_times_s) == 8
        seen = truth[f"lab-{r.request_id}"]
        arrival, written = float(seen["arrival"]), [float(c) for c in seen["chunks"]]
        assert written[0] - arrival >= 0.05  # the server's TTFT: the scripted 50 ms, at least
        # what the client saw is what the server did, give or take the loopback and what the client
        # said of its own lateness: each chunk read never before its write and soon after it; TTFT
        # as soon after the server's (the client stamps a send once its write returns: the server
        # may have it a bit earlier)
        assert all(0 <= c - w < slack for c, w in zip(r.chunk_times_s, written)), (slack, r.chunk_times_s, written)
        assert abs(lat.ttft_ms / 1e3 - (written[0] - arrival)) < slack
        assert lat.itl_ms == pytest.approx(list(1e3 * np.diff(r.chunk_times_s)))
        assert lat.e2e_ms - lat.ttft_ms == pytest.approx(sum(lat.itl_ms))


def test_closed_loop_never_exceeds_concurrency(factory):
    with FakeOpenAIServer(Script(ttft_s=0.02, itl_s=0.005)) as srv:
        records = run_points(
            Endpoint(srv.base_url, "m"), workload(load_points=[{"concurrency": 3}], num_requests=12), factory, seed=0
        )
        assert srv.truth.max_in_flight == 3
    assert [r.point for r in records] == [0] * 12


def test_multi_token_chunks_counted(factory):
    with FakeOpenAIServer(Script(tokens_per_chunk=3)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), workload(num_requests=2), factory, seed=0)
    assert len(records) == 2
    for r in records:
        assert r.chunk_tokens == [3, 3, 2] and r.output_tokens == 8


@pytest.mark.parametrize("closing", ["last_token", "separate"])
def test_closing_chunk_counted_only_when_it_carries_a_token(factory, closing):
    # vLLM sends its last token with the finish reason, with empty text when that token is a
    # partial UTF-8 byte; SGLang sends an extra empty chunk. The final usage tells them apart.
    # Chunks 40 ms apart: each token's time is its own chunk's, nearer to it than to the next or
    # the previous one by a margin no scheduling lag of this machine reaches.
    with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.04, usage=False, closing=closing)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), workload(num_requests=2), factory, seed=0)
        truth = srv.truth.by_request
    records, slack = run.records, late_by(run.client)
    assert len(records) == 2
    for r in records:
        assert r.ok and r.output_tokens == 8
        assert r.chunk_tokens == [1] * 8 and len(r.chunk_times_s) == 8
        sent = truth[f"lab-{r.request_id}"]["chunks"]
        assert all(0 <= c - s < slack for s, c in zip(sent, r.chunk_times_s))  # each token at its own chunk


def test_chunks_that_come_in_one_read_are_counted_and_invalidate_the_itl(factory):
    """A server that writes its chunks two at a time: the second of each pair arrives in the
    same read as the first, so the two share one instant; the records count it, and the point's
    ITL is judged the client's reads."""
    from orchestrator.config.schema import ValiditySpec
    from orchestrator.metrics.fidelity import client_validity

    with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.02, burst=2)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), workload(num_requests=2), factory, seed=0)
    # pairs 40 ms apart are read apart unless the client stalled longer, which it would have said
    stalled = run.client["loop_lag_ms_max"] > 30
    for r in run.records:
        assert r.ok and r.chunk_tokens == [1] * 8
        gaps = np.diff(r.chunk_times_s)
        assert max(gaps[0::2]) == 0.0  # a pair's second chunk came in its first's read: one instant...
        assert r.coalesced_chunks == 4 or (stalled and r.coalesced_chunks > 4), (r.coalesced_chunks, run.client)
        assert stalled or min(gaps[1::2]) > 0.015, (gaps, run.client)  # ...and the pairs in reads of their own
    metrics = summarize_point(run.records)
    assert metrics["coalesced_chunk_share"] >= 0.5  # counted: ITL between them is read times
    valid, reasons = client_validity(metrics, ValiditySpec())
    assert not valid and "ITL is not the server's" in reasons[0]
    with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.02)) as srv:  # one chunk a write: none coalesced
        (run,) = run_each(Endpoint(srv.base_url, "m"), workload(num_requests=2), factory, seed=0)
    share = summarize_point(run.records)["coalesced_chunk_share"]
    assert share < ValiditySpec().max_coalesced_share or run.client["loop_lag_ms_max"] > 15, (share, run.client)


def test_errors_become_records(factory):
    with FakeOpenAIServer(Script(fail_every=2)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), workload(num_requests=6, warmup_requests=0), factory, seed=0)
    errors = [r for r in records if r.status == "error"]
    assert len(errors) == 3 and all("HTTP 500" in (r.error or "") for r in errors)
    assert summarize_point(records)["errors"] == 3


def test_unreachable_server_is_error_not_exception(factory):
    records = run_points(
        Endpoint("http://127.0.0.1:9", "m"), workload(num_requests=2, warmup_requests=0), factory, seed=0
    )
    assert len(records) == 2  # every request a record: none dropped
    assert all(r.status == "error" and r.error for r in records), [r.error for r in records]


def test_poisson_point_and_background_class(factory):
    w = workload(
        classes={
            "fg": {"input_tokens": 16, "output_tokens": 2},
            "bg": {"input_tokens": 64, "output_tokens": 1, "rate": 20.0},
        },
        load_points=[{"rate": 20.0}],
        num_requests=30,
        warmup_requests=0,
    )
    with IsolatedFakeServer(Script(ttft_s=0.005, itl_s=0.001)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=1)
    fg = [r for r in run.records if r.request_class == "fg"]
    bg = [r for r in run.records if r.request_class == "bg"]
    assert len(fg) == 30 and len(bg) > 5
    m = summarize_point(fg, target_rate=20.0)
    assert m["achieved_rate"] == pytest.approx(20.0, rel=0.5)
    assert m["send_lag_ms_p99"] < 1e3 * late_by(run.client)


def test_duration_bounded_point(factory):
    w = workload(load_points=[{"concurrency": 2, "duration_s": 0.5}], num_requests=None)
    with IsolatedFakeServer(Script(ttft_s=0.01, itl_s=0.005)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), w, factory, seed=0)
    assert len(records) >= 4
    # a stream takes its next request only before the point's end: none is picked after 0.5 s
    assert max(r.intended_send_s for r in records) - min(r.intended_send_s for r in records) < 0.5


def test_points_draw_from_their_own_streams(factory):
    """A point's requests do not depend on earlier points: same seed, same second point."""
    from orchestrator.loadgen.plan import RequestPlanner, plan_point

    w = workload(
        classes={
            "fg": {"input_tokens": 16, "output_tokens": 4, "range_ratio": 0.5},
            "bg": {"input_tokens": 32, "output_tokens": 1, "rate": 5.0},
        },
        load_points=[{"concurrency": 1}, {"concurrency": 2, "num_requests": 3}],
        num_requests=5,
    )

    def plan(point_index):
        run = plan_point(w, w.load_points[point_index], point_index, RequestPlanner(w, factory), seed=(0, 0))
        fg = [(r.request_class, r.prompt, r.output_tokens) for r in run.foreground]
        bg = [(t, r.prompt) for t, r in run.background[0]]
        return fg, bg

    assert plan(1) == plan(1)
    assert plan(0) != plan(1)
    fg, bg = plan(1)
    assert len(fg) == 3 and len(bg) > 10  # background planned ahead for the horizon


def test_chat_api_streams(factory):
    with FakeOpenAIServer(Script(ttft_s=0.01, itl_s=0.002)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), workload(api="chat", num_requests=3), factory, seed=0)
    assert all(r.ok and r.output_tokens == 8 for r in records)
    assert srv.truth.paths == {"/v1/chat/completions"}


def test_trace_point_replays_timestamps(factory):
    from tests.conftest import ROOT

    w = workload(
        load_points=[{"trace": str(ROOT / "tests/data/trace_sample.jsonl"), "time_scale": 0.4}],
        warmup_requests=0,
        num_requests=None,
    )
    with IsolatedFakeServer(Script(ttft_s=0.005, itl_s=0.001)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
    records = run.records
    assert len(records) == 12 and {r.request_class for r in records} == {"trace"}
    t0 = records[0].intended_send_s
    assert [round(r.intended_send_s - t0, 3) for r in records] == [round(i * 0.25 * 0.4, 3) for i in range(12)]
    assert [r.input_tokens_target for r in records] == [16 + i for i in range(12)]
    assert max(r.sent_s - r.intended_send_s for r in records) < late_by(run.client)


def test_infinite_rate_sends_everything_at_once(factory):
    w = workload(load_points=[{"rate": "inf"}], num_requests=8, warmup_requests=0)
    with IsolatedFakeServer(Script(ttft_s=0.05, itl_s=0.001)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
        assert srv.truth.max_in_flight == 8
    records = run.records
    assert len({r.intended_send_s for r in records}) == 1  # one instant for all
    assert max(r.sent_s for r in records) - min(r.sent_s for r in records) < late_by(run.client)


def test_the_event_loop_is_watched_until_every_stream_is_read(factory):
    """At ``rate: inf`` the sends end at once; the streams are read for ~0.5 s after: the loop's
    lag is sampled over that time too (it was not sampled at all before)."""
    w = workload(
        classes={"a": {"input_tokens": 32, "output_tokens": 25}},
        load_points=[{"rate": "inf"}],
        num_requests=4,
        warmup_requests=0,
    )
    with IsolatedFakeServer(Script(ttft_s=0.05, itl_s=0.02)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, factory, seed=0)
    # sampled (before, the watcher stopped with the sends, at once: no sample, no loop_lag_* keys)
    assert run.client["loop_lag_ms_max"] >= run.client["loop_lag_ms_p95"] >= 0, run.client


def test_rate_with_concurrency_cap_never_bursts(factory):
    # 40 req/s but each request takes ~100 ms and only 2 may be in flight: the client must
    # hold at most 2 and, after waiting for a slot, never send faster than 40/s.
    w = workload(
        load_points=[{"rate": 40.0, "max_concurrency": 2, "arrival": "constant"}], num_requests=12, warmup_requests=0
    )
    with IsolatedFakeServer(Script(ttft_s=0.1, itl_s=0.001)) as srv:
        records = run_points(Endpoint(srv.base_url, "m"), w, factory, seed=0)
        assert srv.truth.max_in_flight <= 2
    sends = sorted(r.sent_s for r in records)
    assert min(b - a for a, b in zip(sends, sends[1:])) >= 1 / 40 - 0.003
    assert summarize_point(records)["send_lag_ms_max"] > 100  # the cap shows up as send lag


def test_the_quick_tokenizer_answers_as_autotokenizer(tiny_model_dir, factory):
    """load_tokenizer reads tokenizer.json with the tokenizers library alone (no transformers
    import) where transformers would load its generic class: same ids, same text, same special
    ids and sizes, same prompts."""
    from transformers import AutoTokenizer

    from orchestrator.loadgen.prompts import RustTokenizer, load_tokenizer

    quick, auto = load_tokenizer(str(tiny_model_dir)), AutoTokenizer.from_pretrained(str(tiny_model_dir))
    assert isinstance(quick, RustTokenizer)
    assert (len(quick), quick.vocab_size, sorted(quick.all_special_ids)) == (
        len(auto),
        auto.vocab_size,
        sorted(auto.all_special_ids),
    )
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(0, len(auto), int(rng.integers(1, 40))).tolist()
        text = auto.decode(ids)
        assert quick.decode(ids) == text
        assert quick.encode(text, add_special_tokens=False) == auto.encode(text, add_special_tokens=False)
    with pytest.raises(ValueError, match="without special tokens"):
        quick.encode("x", add_special_tokens=True)  # what transformers adds then is not copied
    other = PromptFactory(auto)
    assert list(factory._ids) == list(other._ids)
    for seed in range(5):
        assert factory.prompt(100, np.random.default_rng(seed)) == other.prompt(100, np.random.default_rng(seed))
        assert factory.ramp_prompt(64, np.random.default_rng(seed)) == other.ramp_prompt(
            64, np.random.default_rng(seed)
        )


@pytest.mark.parametrize(
    "change",
    [
        {"clean_up_tokenization_spaces": True},  # transformers would clean the decoded text
        {"add_prefix_space": True},  # a key whose effect we do not copy
        {"added_tokens_decoder": {"999": {"content": "<extra>", "special": True}}},  # not in tokenizer.json
        {"added_tokens_decoder": {"0": {"content": "<s>", "special": True, "lstrip": True}}},  # other flags
        {"bos_token": "<bos>"},  # a special token tokenizer.json does not have: transformers adds it
        {"extra_special_tokens": {"image_token": "<s>"}},  # named extra tokens
        {"additional_special_tokens": ["<s>"], "extra_special_tokens": ["</s>"]},  # both lists
        {"special_tokens_map.json": {"bos_token": "</s>"}},  # says otherwise than the config
    ],
)
def test_a_tokenizer_config_we_do_not_copy_goes_to_transformers(tiny_model_dir, tmp_path, change):
    import shutil

    from orchestrator.loadgen.prompts import RustTokenizer, load_tokenizer

    folder = tmp_path / "tok"
    folder.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, folder / name)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    change = dict(change)
    special_map = change.pop("special_tokens_map.json", None)
    if special_map is not None:
        (folder / "special_tokens_map.json").write_text(json.dumps(special_map))
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, **change}))
    loaded = load_tokenizer(str(folder))
    assert not isinstance(loaded, RustTokenizer) and type(loaded).__name__ == "TokenizersBackend"
    (folder / "special_tokens_map.json").write_text(json.dumps({"bos_token": "<s>"}))  # agrees with the config
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert isinstance(load_tokenizer(str(folder)), RustTokenizer)
