"""The lab tools of orchestrator/labs/: the static-batching baseline, the roofline and the KV worksheet."""

from __future__ import annotations

import pytest

from orchestrator.config.schema import ModelArch
from orchestrator.perf.kv import kv_bytes_per_token, kv_capacity
from orchestrator.perf.roofline import decode_floor

LLAMA_8B = ModelArch(num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, params_b=8.03)


def test_kv_arithmetic_matches_the_course():
    # seeds/001: 32 layers x 8192 tokens x 2 x 32 heads x 128 dim x 2 bytes = 4 GiB (MHA)
    mha = LLAMA_8B.model_copy(update={"num_kv_heads": 32})
    assert kv_bytes_per_token(mha) * 8192 == 4 * 1024**3
    assert kv_bytes_per_token(LLAMA_8B) == 128 * 1024  # GQA: 8 KV heads
    assert kv_bytes_per_token(LLAMA_8B, "fp8") == 64 * 1024
    cap = kv_capacity(LLAMA_8B, 80, 0.9)
    assert 400_000 < cap.tokens < 450_000
    assert kv_capacity(LLAMA_8B, 80, 0.9, tp=2).tokens > 2 * cap.tokens  # weights split too


def test_decode_floor_is_memory_bound_at_batch_1():
    # seeds/003 week 3: "16 GB model / 2 TB/s = 8 ms"
    f = decode_floor(LLAMA_8B, 2039, 312, batch=1)
    assert f.bound == "memory" and f.floor_ms == pytest.approx(7.9, abs=0.1)
    assert f.arithmetic_intensity == pytest.approx(1.0, abs=0.01)
    big = decode_floor(LLAMA_8B, 2039, 312, batch=1024)
    assert big.bound == "compute" and big.arithmetic_intensity > 153


def test_roofline_and_worksheet_cli(capsys):
    from orchestrator.labs import kv_worksheet, roofline_worksheet

    roofline_worksheet.main(["--batch", "1", "256"])
    out = capsys.readouterr().out
    assert "memory" in out and "ridge 153 FLOP/byte" in out
    kv_worksheet.main(["--gpu", "L4-24GB", "--max-model-len", "131072"])
    out = capsys.readouterr().out
    assert "128 KiB" in out and "NO:" in out
    with pytest.raises(SystemExit):
        roofline_worksheet.main(["--model", "nope"])


def test_static_baseline_times_every_token(tiny_model_dir):
    import numpy as np

    from orchestrator.labs.static_baseline import run_static
    from orchestrator.loadgen.client import PlannedRequest
    from orchestrator.loadgen.prompts import PromptFactory
    from orchestrator.metrics.summary import summarize_point

    factory = PromptFactory(str(tiny_model_dir))
    rng = np.random.default_rng(0)
    reqs = [
        PlannedRequest(i, "main", factory.prompt(n_in, rng), n_in, n_out)
        for i, (n_in, n_out) in enumerate([(16, 4), (24, 12), (16, 8), (8, 2)])
    ]
    records, extra = run_static(str(tiny_model_dir), str(tiny_model_dir), reqs, batch_size=2)
    assert [len(r.chunk_times_s) for r in records] == [4, 12, 8, 2]
    # a static batch decodes until its longest member: (12 + 12 + 8 + 8) steps for 26 useful tokens
    assert extra["padding_waste"] == pytest.approx(1 - 26 / 40)
    later = records[2]
    assert later.chunk_times_s[0] > records[1].chunk_times_s[-1]  # the second batch waits for the first
    m = summarize_point(records)
    assert m["completed"] == 4 and m["output_tokens"] == 26 and m["tokens_per_second"] > 0


def test_the_labs_table_is_read_from_the_console_and_the_results_on_disk(tmp_path):
    import json
    from collections import Counter

    from orchestrator.labs.labs import LabRun, read_outcome, table

    trials = tmp_path / "sweep" / "trials"
    for i, (variant, status, error) in enumerate(
        [
            ("a", "FINISHED", None),
            ("b", "SKIPPED", "needs GPUs"),
            ("c", "FAILED", "EvalError: lm-eval exited with 1: boom\nmore"),
        ]
    ):
        (trials / f"00{i}-x").mkdir(parents=True)
        (trials / f"00{i}-x" / "result.json").write_text(
            json.dumps({"status": status, "variant": variant, "trial_hash": f"h{i}" * 8, "error": error})
        )
    run = LabRun("quantization", 0, 125.0, tmp_path / "q.log")
    read_outcome(
        run,
        [
            "noise",
            f"sweep 'quantization': 3 trial(s); results in {tmp_path / 'sweep'}",
            "Verdict: a: tokens_per_second 700; objective: maximize tokens_per_second.",
            "Expectations: 1 observed, 1 not observed, 0 not measurable here (of 2)",
            "  [observed] INT4 reads fewer bytes (tokens_per_second: a 700 > b 500)",
            "  [not observed] FP8 keeps accuracy (accuracy within 0.05 of a 0.8: b 0.6)",
            "done",
        ],
    )
    assert run.expected == (1, 1, 0) and len(run.claims) == 2
    assert dict(run.counts) == {"FINISHED": 1, "SKIPPED": 1, "FAILED": 1} and not run.ok
    assert run.verdict.startswith("Verdict: a:")
    lines = table([run, LabRun("moe", 0, 5.0, tmp_path / "m.log")])
    assert lines[2] == (
        "| quantization | 1 | 1 | 1 | Verdict: a: tokens_per_second 700; objective: maximize "
        "tokens_per_second. | 1/1/0 | 2m05s |"
    )
    assert "| moe | 0 | 0 | 0 | none: no trial runs on this machine | none declared | 0m05s |" in lines
    assert "- [not observed] FP8 keeps accuracy (accuracy within 0.05 of a 0.8: b 0.6)" in lines
    failed = LabRun("scheduling_policies", 0, 5.0, tmp_path / "s.log", counts=Counter(FAILED=2, SKIPPED=2))
    assert (
        "| scheduling_policies | 0 | 2 | 2 | none: every trial that could run FAILED (below) | none declared | 0m05s |"
        in table([failed])
    )
    assert "- quantization / c: EvalError: lm-eval exited with 1: boom" in lines


def test_an_undecided_lab_is_its_own_outcome_with_what_deciding_would_cost(tmp_path):
    """Issue 58: `make labs` called seven labs NOT OK whose race was only undecided."""
    import json

    from orchestrator.labs.labs import LabRun, read_outcome, table

    trials = tmp_path / "sweep" / "trials"
    for i, (h, repeat_of) in enumerate(
        [("a" * 16, None), ("b" * 16, None), ("c" * 16, "a" * 16), ("d" * 16, "b" * 16)]
    ):
        (trials / f"00{i}-x").mkdir(parents=True)
        (trials / f"00{i}-x" / "result.json").write_text(
            json.dumps({"status": "FINISHED", "variant": None, "trial_hash": h, "repeat_of": repeat_of})
        )
    run = LabRun("speculative_decoding", 4, 600.0, tmp_path / "s.log")
    read_outcome(
        run,
        [
            f"sweep 'speculative_decoding': 2 trial(s); results in {tmp_path / 'sweep'}",
            "Verdict: undecided after the budget: ngram or off (95% confidence ...); the leader ngram: tpot 9; at the "
            "noise measured (30.0% between runs) deciding it needs about 40 runs each: run with objective.max_repeats=40",
        ],
    )
    assert run.ok and dict(run.counts) == {"FINISHED": 2} and run.runs_each == 2
    # 2 runs each took 600 s; 38 more rounds at 300 s each
    assert run.outcome == "undecided after 2 run(s) each; deciding needs about 40 each (~190m00s more here)"
    assert (
        "| speculative_decoding | 2 | 0 | 0 | **undecided after 2 run(s) each; deciding needs about 40"
        in table([run])[2]
    )
    assert LabRun("x", 4, 1.0, tmp_path / "x.log").outcome == "undecided after 1 run(s) each"
    close = LabRun("x", 4, 1.0, tmp_path / "x.log")
    read_outcome(
        close,
        [
            "Verdict: undecided after the budget: a or b (...); at the noise measured (9.0% between runs) "
            "a difference this close to the margin is not told by any practical number of runs; widen ..."
        ],
    )
    assert close.outcome == "undecided after 1 run(s) each; no practical number of runs decides it here"
    assert LabRun("x", 1, 1.0, tmp_path / "x.log").outcome == "NOT OK"


def test_a_terminated_labs_runner_stops_the_sweep_it_runs(tmp_path):
    """``kill`` reaches the labs runner alone: it passes SIGTERM to the running sweep (which stops
    its trials and servers) and waits for it; the sweep went on without it."""
    import os
    import signal
    import subprocess
    import sys
    import textwrap
    import time

    fake = tmp_path / "fake_sweep"
    fake.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            import signal, sys, time, pathlib
            mark = pathlib.Path({str(tmp_path)!r})
            def term(signum, frame):
                (mark / "got_term").write_text("1")
                sys.exit(130)
            signal.signal(signal.SIGTERM, term)
            (mark / "started").write_text("1")
            print("sweep running", flush=True)
            time.sleep(60)
            """
        )
    )
    fake.chmod(0o755)
    runner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import sys; from pathlib import Path; sys.executable = {str(fake)!r}; "
            f"from orchestrator.labs.labs import run_lab; run_lab('x', [], Path({str(tmp_path / 'x.log')!r}))",
        ],
        stdout=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while not (tmp_path / "started").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    os.kill(runner.pid, signal.SIGTERM)
    assert runner.wait(timeout=30) == 128 + signal.SIGTERM
    assert (tmp_path / "got_term").exists(), "the sweep never heard of it"
