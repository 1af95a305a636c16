"""A lab's workload sized from its engine's speed (issue 58): the rules' arithmetic, and the
sweep step that applies them to every job (a key the command line sets is the user's)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time

import psutil
import pytest

from orchestrator.config.convert import config_to_dict, to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.schema import SizeRule, SizingSpec
from orchestrator.metrics import census
from orchestrator.perf.sizing import EngineSpeed, choose
from orchestrator.scheduling import sizing
from orchestrator.trial import calibrate

LONG = "workload.classes.long.input_tokens"


def speed(decode_ms: float = 10.0, per_token: float = 0.05, fixed: float = 20.0) -> EngineSpeed:
    return EngineSpeed(decode_ms, per_token, fixed, (128, 1024), "cpu:2x test", "vllm test", "tiny", 0.0)


def rule(**kw) -> SizeRule:
    return SizeRule.model_validate(kw)


def test_prefill_steps_sizes_prompts_from_the_speed():
    # 40 steps of 10 ms = 400 ms: (400 - 20) / 0.05 = 7600 tokens, capped at 6144
    out = choose([rule(set=LONG, prefill_steps=40, min=1024, max=6144, round_to=256)], speed(), lambda k: 1024)
    assert out[0].value == 6144 and out[0].was == 1024
    assert "7600 tokens would be needed, capped at 6144" in out[0].why
    # a slow prefill (0.4 ms/token): 40 steps need (400 - 20) / 0.4 = 950 tokens, held at the written min
    assert (
        choose([rule(set=LONG, prefill_steps=40, min=1024, round_to=256)], speed(per_token=0.4), lambda k: 1)[0].value
        == 1024
    )
    # in between: rounded up to the step, so the prefill is at least the steps asked
    got = choose([rule(set=LONG, prefill_steps=40, round_to=256)], speed(per_token=0.2), lambda k: 1)[0]
    assert got.value == 2048 and "~43 decode steps" in got.why  # (20 + 0.2 x 2048) / 10


def test_later_rules_read_earlier_choices():
    rules = [
        rule(set=LONG, prefill_steps=40, min=1024, max=6144, round_to=256),
        rule(set="workload.classes.long.rate", busy_share=0.5, tokens=LONG, max=0.8, round_to=0.05),
        rule(
            set="engine.max_model_len",
            fits=[LONG, "workload.classes.long.output_tokens"],
            margin=64,
            min=2048,
            round_to=256,
        ),
    ]
    current = {
        LONG: 1024,
        "workload.classes.long.output_tokens": 4,
        "workload.classes.long.rate": 0.8,
        "engine.max_model_len": 2048,
    }
    out = {s.key: s.value for s in choose(rules, speed(), current.__getitem__)}
    # 6144 tokens prefill in 20 + 307 ms: half the time busy at 1.53/s, capped at the written 0.8
    assert out == {LONG: 6144, "workload.classes.long.rate": 0.8, "engine.max_model_len": 6400}
    slow = {s.key: s.value for s in choose(rules, speed(decode_ms=40, per_token=0.4), current.__getitem__)}
    # 40 x 40 ms = 1600 ms: (1600 - 20) / 0.4 = 3950 -> 4096 tokens, prefilled in 1658 ms: 0.5 / 1.658 = 0.30/s
    assert slow[LONG] == 4096 and slow["workload.classes.long.rate"] == pytest.approx(0.3)


def test_a_rule_is_one_kind_with_what_it_needs():
    with pytest.raises(ValueError, match="exactly one of"):
        rule(set=LONG, prefill_steps=4, fits=["x"])
    with pytest.raises(ValueError, match="busy_share needs 'tokens'"):
        rule(set="workload.classes.long.rate", busy_share=0.5)
    with pytest.raises(ValueError, match="pattern"):
        rule(set="hydra.job.name", prefill_steps=4)


def test_a_bad_sizing_key_is_named_before_anything_starts(compose):
    data = config_to_dict(compose(["+experiment=chunked_prefill"]))
    data["per_platform"]["cpu"]["sizing"]["rules"][0]["prefill_step"] = 3
    with pytest.raises(ConfigError, match="sizing"):
        to_specs(data)


@pytest.fixture
def fast_prefill(monkeypatch):
    """The calibration as a machine whose prefill is fast (AMX): no server is started."""
    calls = []

    def measured(spec, workdir, probes, say, again=False):
        calls.append((spec.variant, probes))
        return speed(), True

    monkeypatch.setattr(sizing, "engine_speed", measured)
    return calls


def jobs_of(compose, overrides: list[str], variants=("chunking_off", "budget_256")):
    return [
        (
            overrides + [f"variant={v}"],
            config_to_dict(compose(["+experiment=chunked_prefill", *overrides, f"variant={v}"])),
        )
        for v in variants
    ]


def test_every_job_gets_the_sized_workload(compose, fast_prefill, tmp_path):
    lines: list[str] = []
    configs, params = sizing.size_sweep(jobs_of(compose, []), tmp_path, lines.append)
    assert fast_prefill == [("chunking_off", (128, 1024))]  # the baseline's server, once
    for overrides, data in configs:
        trial, _ = to_specs(data, overrides)
        assert trial.workload.classes["long"].input_tokens == 6144
        assert trial.engine.max_model_len == 6400
    assert params["sizing." + LONG] == "6144" and "decode step 10.0 ms" in params["sizing.speed"]
    assert any(line.startswith(f"sizing: {LONG} 1024 -> 6144 (long prompts: a prefill of ~") for line in lines)
    assert (tmp_path / "sizing.json").exists()
    # a tuner's next step (another launch, the same console): the same sizes, not said again
    again: list[str] = []

    def say(line: str) -> None:
        again.append(line)

    for _ in range(2):
        sized, _ = sizing.size_sweep(jobs_of(compose, []), tmp_path, say)
        assert to_specs(sized[0][1], sized[0][0])[0].workload.classes["long"].input_tokens == 6144
    assert again and len(again) == len(set(again)), again


def test_a_key_the_command_line_sets_is_not_sized(compose, fast_prefill, tmp_path):
    mine = ["workload.classes.long.input_tokens=1500"]
    lines: list[str] = []
    configs, _ = sizing.size_sweep(jobs_of(compose, mine), tmp_path, lines.append)
    trial, _ = to_specs(configs[0][1], configs[0][0])
    assert trial.workload.classes["long"].input_tokens == 1500
    assert f"sizing: {LONG} is set on the command line: not sized" in lines
    # the context still holds the user's prompt
    assert trial.engine.max_model_len == 2048


def test_a_dry_run_measures_nothing(compose, monkeypatch, tmp_path):
    monkeypatch.setattr(sizing, "cached_speed", lambda key: None)
    monkeypatch.setattr(sizing, "engine_speed", lambda *a, **k: pytest.fail("a dry run started a server"))
    lines: list[str] = []
    configs, params = sizing.size_sweep(jobs_of(compose, ["dry_run=true"]), tmp_path, lines.append)
    assert params == {} and "not calibrated yet" in lines[-1]
    assert to_specs(configs[0][1], configs[0][0])[0].workload.classes["long"].input_tokens == 1024


def test_sizing_off_and_labs_without_it(compose, fast_prefill, tmp_path):
    configs, params = sizing.size_sweep(jobs_of(compose, ["+sizing=null"]), tmp_path, print)
    assert params == {} and fast_prefill == []
    plain = [([], config_to_dict(compose(["+experiment=continuous_batching"])))]
    assert sizing.size_sweep(plain, tmp_path, print) == (plain, {})
    assert SizingSpec.model_fields["probe_tokens"].default == (128, 1024)


def test_a_calibration_counts_the_cpu_of_other_work_not_its_servers(monkeypatch):
    """A child spinning 0.8 s of CPU is other work to a calibration that does not own it (though
    it is a child of this process), and none to one whose server it is (psutil's readings). What
    else runs beside it (lint, another test) counts in both and cancels in their difference. No
    sweep's driver is named in this process (an earlier test in the same worker may have started
    Ray in it, which names it): the child would carry the mark and count as the sweep's."""
    monkeypatch.delenv(census.DRIVER_ENV, raising=False)
    child = subprocess.Popen(
        [sys.executable, "-c", "import time\nwhile time.process_time() < 0.8: pass\ntime.sleep(60)"]
    )
    try:
        anyone, its_server = calibrate.OtherWork([]), calibrate.OtherWork([child.pid])
        proc, deadline = psutil.Process(child.pid), time.monotonic() + 30
        while sum(proc.cpu_times()[:2]) < 0.75 and time.monotonic() < deadline:  # read in 10 ms ticks
            time.sleep(0.05)
        wall = time.monotonic() - anyone.t0
        others, others_but_it = anyone.cores(), its_server.cores()
    finally:
        child.kill()
        child.wait()
    assert others_but_it >= 0.0
    assert time.monotonic() < deadline, "the child did not spin"
    assert (others - others_but_it) * wall > 0.5, (others, others_but_it, wall)  # its 0.8 s less its start-up


def test_a_calibration_beside_other_work_sizes_its_sweep_but_is_not_cached(compose, monkeypatch, tmp_path):
    monkeypatch.setattr(calibrate, "CACHE", tmp_path / "engine-speed.json")
    busy = dataclasses.replace(speed(), other_cores=calibrate.BUSY_CORES + 0.5)
    monkeypatch.setattr(calibrate, "measure_speed", lambda *a: busy)
    spec, _ = to_specs(compose(["+experiment=chunked_prefill"]))
    lines: list[str] = []
    assert calibrate.engine_speed(spec, tmp_path, (128, 1024), lines.append) == (busy, True)
    assert "other work used 0.75 cores" in lines[-1] and "not cached" in lines[-1]
    assert calibrate.cached_speed(calibrate.speed_key(spec, (128, 1024))[0]) is None
    quiet = dataclasses.replace(busy, other_cores=0.02, measured_at=time.time())
    monkeypatch.setattr(calibrate, "measure_speed", lambda *a: quiet)
    assert calibrate.engine_speed(spec, tmp_path, (128, 1024), lines.append) == (quiet, True)
    assert calibrate.engine_speed(spec, tmp_path, (128, 1024), lines.append) == (quiet, False)  # kept
    # past its age, a calibration is measured again, and the line says why
    monkeypatch.setattr(calibrate, "MAX_AGE_S", 3600.0)
    calibrate.keep_speed(
        calibrate.speed_key(spec, (128, 1024))[0], dataclasses.replace(quiet, measured_at=time.time() - 7300)
    )
    assert calibrate.engine_speed(spec, tmp_path, (128, 1024), lines.append) == (quiet, True)
    assert "the cached one is 2 h old" in lines[-1] and "kept for 1 h" in lines[-1]
    # an entry kept before calibrations read the machine's other work is measured again
    key = calibrate.speed_key(spec, (128, 1024))[0]
    old = {k: v for k, v in quiet.as_dict().items() if k != "other_cores"}
    (tmp_path / "engine-speed.json").write_text(json.dumps({key: old}))
    assert calibrate.cached_speed(key) is None


def test_a_pd_pair_is_calibrated_as_one_server_of_its_engine(compose, monkeypatch, tmp_path):
    """The P/D lab's rate is sized against one server's prefill: a pair (or replicas behind a
    router) as the sweep's first trial is measured as one server of its engine, under the key a
    plain server of that engine has, never through its proxy."""
    monkeypatch.setattr(calibrate, "CACHE", tmp_path / "engine-speed.json")
    asked, now = [], dataclasses.replace(speed(), measured_at=time.time())
    monkeypatch.setattr(calibrate, "measure_speed", lambda spec, *a: asked.append(spec) or now)
    pair, _ = to_specs(compose(["+experiment=disaggregated_pd", "variant=pd_cpu_in1000"]))
    plain, _ = to_specs(compose(["+experiment=disaggregated_pd", "variant=standard_in1000"]))
    assert pair.engine.disaggregation is not None and calibrate.one_server(plain) is plain
    lines: list[str] = []
    calibrate.engine_speed(pair, tmp_path, (128, 1024), lines.append)
    (alone,) = asked
    assert alone.engine.disaggregation is None and alone.engine.max_model_len == pair.engine.max_model_len
    assert "calibrating pd_cpu_in1000's engine as one server" in lines[-1]
    # the plain server finds that measurement: one speed per engine on this machine
    assert calibrate.engine_speed(plain, tmp_path, (128, 1024), lines.append) == (now, False)
    routed, _ = to_specs(compose(["+experiment=scheduling_policies", "variant=dp2_round_robin"]))
    assert routed.engine.router is not None and calibrate.one_server(routed).engine.router is None

    # and whether it can run here is asked of that one server, not of the pair (a 1-core host
    # refuses a pair, "a core each", but runs one server: the lab is still sized)
    class Refuses:
        def unsupported(self, spec):
            return "2 CPU ranks need one core each" if spec.engine.disaggregation is not None else None

    monkeypatch.setattr(sizing, "adapter_for", lambda name: Refuses())
    monkeypatch.setattr(sizing, "engine_speed", lambda spec, *a: (now, True))
    assert sizing._speed(pair, False, (128, 1024), tmp_path, lines.append) == (now, True)
