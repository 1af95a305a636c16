"""Trace replay: the formats and their checks (a bad line names the file, the line and the
field), the slice a point replays (scaled, capped, counted), the prefix reuse an infinite cache
would find, prompts whose equal block ids are equal text, and the config that asks for it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.config import ConfigError, to_specs
from orchestrator.loadgen.traces import ideal_reuse, read_trace, replay_slice, reusable_tokens

pytestmark = pytest.mark.measures

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SLICE = ROOT / "conf" / "traces" / "mooncake_conversation_5min.jsonl"


def test_plain_jsonl_and_csv():
    rows = read_trace(str(DATA / "trace_sample.jsonl")).rows
    assert len(rows) == 12 and rows[0].timestamp_s == 0.0 and rows[-1].timestamp_s == pytest.approx(2.75)
    trace = read_trace(str(DATA / "trace_sample.csv"))
    assert trace.format == "plain" and len(trace.sha256) == 64
    assert [(r.timestamp_s, r.input_tokens) for r in trace.rows] == [(0.0, 10), (0.5, 20)]  # sorted by time


def test_mooncake_and_azure(tmp_path):
    moon = tmp_path / "m.jsonl"
    lines = [
        {"timestamp": 1000, "input_length": 1000, "output_length": 5, "hash_ids": [0, 1]},
        {"timestamp": 3500, "input_length": 600, "output_length": 7, "hash_ids": [0, 2]},
    ]
    moon.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    trace = read_trace(str(moon))
    assert trace.format == "mooncake" and trace.block_tokens == 512
    assert [(r.timestamp_s, r.input_tokens, r.blocks) for r in trace.rows] == [(0.0, 1000, (0, 1)), (2.5, 600, (0, 2))]
    azure = tmp_path / "a.csv"
    azure.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n"
        "2023-11-16 18:15:46.6805900,374,44\n"
        "2023-11-16 18:15:50.9951690,396,109\n"
    )
    trace = read_trace(str(azure))
    assert trace.format == "azure" and [r.output_tokens for r in trace.rows] == [44, 109]
    assert trace.rows[1].timestamp_s == pytest.approx(4.314579, abs=1e-6)


@pytest.mark.parametrize(
    "line, words",
    [
        ('{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [0]}', "line 2: field 'input_length'"),
        ('{"timestamp": -5, "input_length": 10, "output_length": 1, "hash_ids": [0]}', "line 2: field 'timestamp'"),
        ('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": "x"}', "line 2: field 'hash_ids'"),
        ('{"timestamp": 0, "input_length": 1000, "output_length": 1, "hash_ids": [0]}', "1 blocks for 1000 input"),
        ("not json", "line 2: not JSON"),
    ],
)
def test_a_bad_line_names_the_file_the_line_and_the_field(tmp_path, line, words):
    f = tmp_path / "bad.jsonl"
    f.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n' + line + "\n")
    with pytest.raises(ConfigError, match="bad.jsonl") as exc:
        read_trace(str(f))
    assert words in str(exc.value)


def test_a_file_of_no_known_format_says_what_each_format_needs(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(json.dumps({"timestamp": 0, "input_tokens": 5}) + "\n")
    with pytest.raises(ConfigError, match="output_tokens"):
        read_trace(str(f))
    with pytest.raises(ConfigError, match="does not exist"):
        read_trace(str(tmp_path / "none.jsonl"))


def test_ideal_reuse_counts_blocks_whose_whole_prefix_came_before():
    # [0,1,2] then [0,1,3]: 2 reusable; [5,1]: block 1 after another first block is new; [0,1,2,4]: 3
    assert ideal_reuse([[0, 1, 2], [0, 1, 3], [5, 1], [0, 1, 2, 4]]).reusable == 2 + 0 + 3
    # the whole conversation trace holds ~37% reusable blocks (the figure); its first 5 minutes less
    trace = read_trace(str(SLICE))
    assert 0.2 < ideal_reuse(r.blocks for r in trace.rows).share < 0.25


def test_the_slice_is_scaled_capped_and_counted():
    trace = read_trace(str(SLICE))
    cut = replay_slice(trace, start_s=60, length_scale=4, max_context=2000, num_requests=48, time_scale=3)
    assert len(cut.rows) == 48 and cut.block_tokens == 128 and cut.rows[0].timestamp_s >= 0
    assert all(r.input_tokens + r.output_tokens <= 2000 for r in cut.rows) and cut.truncated > 0
    for r in cut.rows:  # as many blocks as the prompt needs, the last one partial
        assert (len(r.blocks) - 1) * 128 < r.input_tokens <= len(r.blocks) * 128
    dropped = replay_slice(trace, length_scale=4, max_context=2000, over_context="drop", num_requests=48)
    assert dropped.dropped > 0 and len(dropped.rows) == 48
    timed = replay_slice(trace, duration_s=20, time_scale=2)
    assert max(r.timestamp_s for r in timed.rows) * 2 < 20
    reused, total = reusable_tokens(cut.rows, 128)
    assert 0 < reused < total


def test_equal_block_ids_give_the_same_text_in_every_request(tiny_model_dir):
    from orchestrator.config.schema import WorkloadSpec
    from orchestrator.loadgen.plan import RequestPlanner
    from orchestrator.loadgen.prompts import prompt_factory

    w = WorkloadSpec.model_validate(
        {
            "name": "t",
            "classes": {"main": {"input_tokens": 8, "output_tokens": 4}},
            "load_points": [{"concurrency": 1}],
            "num_requests": 1,
        }
    )
    planner = RequestPlanner(w, prompt_factory(str(tiny_model_dir)))
    a = planner.make_blocks("trace", 80, 4, (7, 8, 9), 32)
    b = planner.make_blocks("trace", 70, 4, (7, 8, 10), 32)
    c = planner.make_blocks("trace", 40, 4, (11, 8), 32)
    first_two = planner._blocks[(7, 32)] + planner._blocks[(8, 32)]
    assert a.prompt.startswith(first_two) and b.prompt.startswith(first_two) and not c.prompt.startswith(first_two)
    assert planner.factory.count(a.prompt) == pytest.approx(80, abs=3)


def test_a_trace_workload_replaces_the_load_points_and_its_fields_need_a_trace(compose):
    spec, _ = to_specs(compose(["+experiment=prefix_caching", "workload=mooncake", "variant=apc_on_prefix_1024"]))
    (point,) = spec.workload.load_points
    assert point.trace.endswith("mooncake_conversation_5min.jsonl") and point.length_scale == 4
    with pytest.raises(ConfigError, match="'length_scale': apply to 'trace' points only"):
        to_specs(compose(["workload.load_points=[{rate:2,length_scale:4}]"]))
    with pytest.raises(ConfigError, match="replay: a trace load point"):
        to_specs(compose(["workload.replay={rate:2}"]))


@pytest.mark.parametrize(
    ("override", "said"),
    [
        (
            "workload.replay.trace_start_s=100000",
            "workload.replay: the slice it replays has no request (trace_start_s 100000 is after the trace's last request",
        ),
        (
            "workload.replay.max_context_tokens=1",
            "workload.replay: the slice it replays has no request (all 756 of its requests are over max_context_tokens 1)",
        ),
        (
            "workload.replay.trace=/nonexistent.jsonl",
            "workload.replay.trace: trace: file '/nonexistent.jsonl' does not exist",
        ),
    ],
)
def test_a_replay_that_would_send_nothing_or_reads_no_file_names_workload_replay(compose, override, said):
    """Before any server starts: an empty slice (the point would measure nothing), a missing
    trace, each under the key the user set (workload.replay, not load_points.0)."""
    from orchestrator.trial import check_inputs

    spec, _ = to_specs(compose(["workload=mooncake", override]))
    with pytest.raises(ConfigError) as err:
        check_inputs(spec)
    assert said in str(err.value)


def test_a_replay_whose_burst_the_client_cannot_send_on_time_is_flagged_before_any_server(compose, tmp_path):
    """The issue's case: a trace replayed from its start, an opening burst of many requests at one
    instant: said before the point, with a window this machine can serve instead."""
    import json

    from orchestrator.trial import check_inputs

    rows = [{"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [0, i]} for i in range(80)]
    rows += [
        {"timestamp": 1000 * t, "input_length": 600, "output_length": 20, "hash_ids": [0, 1]} for t in range(1, 200)
    ]
    trace = tmp_path / "burst.jsonl"
    trace.write_text("\n".join(json.dumps(r) for r in rows))
    base = ["workload=mooncake", f"workload.replay.trace={trace}", "workload.replay.trace_start_s=0"]
    spec, _ = to_specs(compose([*base, "workload.replay.num_requests=100", "workload.replay.time_scale=1"]))
    (said,) = [n for n in check_inputs(spec) if "INVALID point here" in n]
    assert said.startswith("workload.replay: its slice would make an INVALID point here: a burst of 80 requests"), said
    assert (
        "a window this machine can serve: trace_start_s=" in said
        and "python -m orchestrator.perf.trace_windows" in said
    )
    # the lab's own slice: nothing said
    spec, _ = to_specs(compose(["workload=mooncake"]))
    assert not [n for n in check_inputs(spec) if "INVALID point here" in n]


BAILIAN = DATA / "bailian_sample.jsonl"


def test_bailian_conversations_are_read_with_their_parents():
    trace = read_trace(str(BAILIAN))
    assert trace.format == "bailian" and trace.block_tokens == 16 and trace.conversations == 2
    by = {r.chat_id: r for r in trace.rows}
    assert by[1].parent is None and by[2].parent == 1 and by[3].parent == 1 and by[5].parent == 2
    assert by[5].blocks[:5] == by[2].blocks  # a follower's prompt extends its parent's conversation


@pytest.mark.parametrize(
    "change, words",
    [
        ({"parent_chat_id": 99}, "field 'parent_chat_id': 99 is no request's chat_id"),
        ({"parent_chat_id": "x"}, "field 'parent_chat_id': expected a chat_id or -1"),
        ({"chat_id": 1}, "field 'chat_id': 1 appears twice"),
        ({"timestamp": 0.0, "chat_id": 7, "parent_chat_id": 5}, "is before its parent 5's"),
        ({"hash_ids": [1]}, "1 blocks for 68 input tokens (expected 5 of 16"),
    ],
)
def test_a_bad_bailian_line_names_the_line_and_the_field(tmp_path, change, words):
    lines = BAILIAN.read_text().splitlines()
    row = json.loads(lines[1])
    row.update(change)
    lines[1] = json.dumps(row)
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ConfigError, match="line 2: field") as err:
        read_trace(str(f))
    assert words in str(err.value) and str(f) in str(err.value)


def test_a_follower_whose_parent_is_not_replayed_is_sent_as_a_first_turn():
    trace = read_trace(str(BAILIAN))
    late = replay_slice(trace, start_s=0.1)  # chat 1 and 2 are before it: 5 and 3 lose their parents
    assert [(r.chat_id, r.parent) for r in late.rows] == [(4, None), (5, None), (3, None), (6, 4)]
    assert late.rooted == 2
    capped = replay_slice(trace, max_context=80)  # followers are dropped, never cut; 5 then has no parent
    assert [r.chat_id for r in capped.rows] == [1, 2, 4, 3, 6] and capped.dropped == 1 and capped.truncated == 0


def test_a_bailian_replay_sends_every_follower_after_its_parents_reply_with_that_reply(tiny_model_dir):
    """Each follower is sent once its parent's reply has ended and not before its own instant;
    its prompt is the parent's prompt and the server's actual reply, then its own text; two
    followers of one reply each extend that reply, not each other."""
    from orchestrator.config.schema import WorkloadSpec
    from orchestrator.loadgen import Endpoint, PromptFactory, run_each
    from orchestrator.metrics.summary import summarize_point
    from testkit.fake_openai_server import FakeOpenAIServer, Script

    w = WorkloadSpec.model_validate(
        {
            "name": "b",
            "classes": {"main": {"input_tokens": 8, "output_tokens": 4}},
            "load_points": [{"trace": str(BAILIAN)}],
            "warmup_requests": 0,
        }
    )
    with FakeOpenAIServer(Script(ttft_s=0.03, itl_s=0.01)) as srv:
        (run,) = run_each(Endpoint(srv.base_url, "m"), w, PromptFactory(str(tiny_model_dir)), seed=0)
        seen = srv.truth.by_request
    recs = run.records
    assert len(recs) == 6 and all(r.ok for r in recs)
    start = min(r.intended_send_s for r in recs)
    prompt = {r.request_id: seen[f"lab-{r.request_id}"]["messages"][0]["content"] for r in recs}
    reply = {r.request_id: "".join(f"<lab-{r.request_id}:{i}>" for i in range(8)) for r in recs}
    # the trace's instants, in order of arrival: 1 (0 s), 2 (0.05), 4 (0.2), 5 (0.3), 3 (0.6), 6 (0.7)
    order = sorted(recs, key=lambda r: r.request_id)
    first, four = (r for r in order if r.turn == 0)
    conv = sorted((r for r in recs if r.conversation_id == first.request_id), key=lambda r: r.sent_s)
    assert [r.turn for r in conv] == [0, 1, 2, 1]  # 1, 2, 5, then 3 (at 0.6 s)
    one, two, five, three = conv
    for parent, child, at in ((one, two, 0.05), (two, five, 0.3), (one, three, 0.6)):
        assert child.sent_s >= parent.done_s and child.sent_s >= start + at - 0.005
        assert prompt[child.request_id].startswith(prompt[parent.request_id])
        assert reply[parent.request_id] in prompt[child.request_id]
    assert reply[two.request_id] not in prompt[three.request_id]  # a branch from the first reply only
    six = next(r for r in recs if r.conversation_id == four.request_id and r.turn == 1)
    assert reply[four.request_id] in prompt[six.request_id]
    assert run.client["trace_conversations"] == 2 and run.client["trace_followers_rooted"] == 0
    m = summarize_point(recs, arrival_classes=["trace"], scheduled=True)
    assert m["ttft_from_schedule_ms_p50"] >= m["ttft_ms_p50"] and m["e2e_from_schedule_ms_max"] >= m["e2e_ms_max"]


@pytest.mark.parametrize("experiment", ["prefix_caching", "lmcache", "scheduling_policies"])
@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_the_labs_on_real_traffic_replay_the_trace_in_every_variant(compose, experiment, platform):
    """workload=mooncake gives prefix_caching, lmcache and scheduling_policies a trace variant:
    every variant of their sweeps composes, validates and replays the trace as its one point."""
    from omegaconf import OmegaConf

    over = [f"+experiment={experiment}", "workload=mooncake", f"platform={platform}"]
    variants = str(OmegaConf.select(compose(over), f"sweeps.{platform}")).split(",")
    for v in variants:
        spec, _ = to_specs(compose([*over, f"variant={v}"]))
        (point,) = spec.workload.load_points
        assert point.trace and point.trace.endswith("mooncake_conversation_5min.jsonl"), v


def test_a_trace_points_setting_on_its_run_names_the_traces_content():
    """The run says which trace it replayed, by content: path and sha256 in the point's setting."""
    import hashlib

    from orchestrator.config.schema import LoadPointSpec
    from orchestrator.trial.points import point_setting

    setting = point_setting(LoadPointSpec(trace=str(BAILIAN), time_scale=2))
    assert setting["trace_sha256"] == hashlib.sha256(BAILIAN.read_bytes()).hexdigest()
    assert setting["trace"] == str(BAILIAN) and setting["time_scale"] == 2
    assert "trace_sha256" not in point_setting(LoadPointSpec(concurrency=2))
