"""lm-eval integration, without a server: the command, the offline task files, the scores."""

from __future__ import annotations

import json
import sys

import pytest

from orchestrator.config import ConfigError, to_specs
from orchestrator.config.schema import EvalSpec
from orchestrator.evaluation import EvalError, eval_argv, local_task_names, parse_results, prepare_local_tasks


def test_eval_config_group(compose):
    spec, _ = to_specs(compose(["eval=addition", "model=tiny_adder"]))
    assert spec.eval.tasks == ["addition"] and spec.eval.local_tasks
    assert spec.model.source == "tiny_trained" and spec.model.tiny.train.task == "addition"
    none, _ = to_specs(compose())
    assert none.eval.tasks == []
    gsm, _ = to_specs(compose(["eval=gsm8k", "platform=gpu"]))
    assert gsm.eval.tasks == ["gsm8k"] and gsm.eval.num_fewshot == 5


def test_no_eval_keeps_trial_hashes_and_eval_changes_them(compose):
    from orchestrator.config import trial_hash

    base, _ = to_specs(compose())
    explicit, _ = to_specs(compose(["eval=none"]))
    scored, _ = to_specs(compose(["eval=addition"]))
    assert trial_hash(base) == trial_hash(explicit) != trial_hash(scored)


def test_bad_task_names_are_refused(compose):
    with pytest.raises(ConfigError, match="eval.tasks"):
        to_specs(compose(["eval.tasks=['gsm8k rm']"]))


def test_argv_is_a_list_with_the_server_and_no_key(tmp_path):
    spec = EvalSpec(tasks=["addition"], local_tasks=True, limit=20, num_fewshot=0, max_gen_toks=8)
    argv = eval_argv(spec, "tiny-adder", "http://127.0.0.1:8000/v1/completions", "/m/tok", tmp_path / "o", tmp_path)
    assert argv[:3] == [sys.executable, "-m", "lm_eval"]
    args = dict(zip(argv[3::1], argv[4::1]))
    assert args["--model"] == "local-completions" and args["--tasks"] == "addition"
    assert "base_url=http://127.0.0.1:8000/v1/completions" in args["--model_args"]
    assert "tokenizer=/m/tok" in args["--model_args"] and "max_gen_toks=8" in args["--model_args"]
    assert args["--limit"] == "20" and args["--num_fewshot"] == "0" and args["--include_path"] == str(tmp_path)
    assert "--log_samples" in argv
    with pytest.raises(EvalError, match="','"):
        eval_argv(spec, "a,b", "http://x/v1/completions", "/t", tmp_path, None)


def test_local_tasks_are_copied_and_unknown_ones_refused(tmp_path):
    assert "addition" in local_task_names()
    d = prepare_local_tasks(EvalSpec(tasks=["addition"], local_tasks=True), tmp_path)
    assert (d / "addition.yaml").exists() and len((d / "addition.jsonl").read_text().splitlines()) == 100
    assert prepare_local_tasks(EvalSpec(tasks=["gsm8k"]), tmp_path) is None
    with pytest.raises(EvalError, match="no local task.*shipped: addition"):
        prepare_local_tasks(EvalSpec(tasks=["nope"], local_tasks=True), tmp_path)


def test_scores_are_parsed_from_lm_evals_results(tmp_path):
    out = tmp_path / "eval" / "tiny-adder"
    out.mkdir(parents=True)
    (out / "results_2026-11-22T10-00-00.json").write_text(
        json.dumps(
            {
                "results": {
                    "addition": {"alias": "addition", "exact_match,none": 0.87, "exact_match_stderr,none": 0.0338}
                }
            }
        )
    )
    m = parse_results(tmp_path / "eval", ["addition"])
    assert m == {
        "eval_addition_exact_match": 0.87,
        "eval_addition_exact_match_stderr": 0.0338,
        "accuracy": 0.87,
        "accuracy_stderr": 0.0338,
    }
    with pytest.raises(EvalError, match="no task 'gsm8k'"):
        parse_results(tmp_path / "eval", ["gsm8k"])
    with pytest.raises(EvalError, match="no results file"):
        parse_results(tmp_path / "nothing", ["addition"])


def test_lm_eval_from_a_relative_trial_folder_finds_the_shipped_task(tmp_path, monkeypatch, tiny_model_dir):
    """The sweep folder Hydra gives by default is relative (``multirun/...``) and lm-eval runs
    inside the trial's task folder: every path it gets must be absolute. Run for real against
    no server: lm-eval finds the task, then fails to connect, and the error's first line says so."""
    from orchestrator.evaluation import run_eval

    monkeypatch.chdir(tmp_path)
    spec = EvalSpec(
        name="addition", tasks=["addition"], local_tasks=True, limit=1, num_concurrent=1, max_gen_toks=4, timeout_s=300
    )
    with pytest.raises(EvalError) as err:
        run_eval(
            spec,
            "http://127.0.0.1:9",
            "tiny",
            str(tiny_model_dir),
            tmp_path.__class__("trials/000-x"),
            progress=lambda _: None,
        )
    log = (tmp_path / "trials" / "000-x" / "eval.log").read_text()
    assert "Tasks not found" not in log and "--include_path" not in str(err.value)
    first = str(err.value).splitlines()[0]
    assert first.startswith("lm-eval exited with") and "Connection" in first, first  # the task was found


def test_an_lm_eval_failure_names_its_cause_on_the_first_line(tmp_path, tiny_model_dir):
    """Consoles and status tables show an error's first line: it carries lm-eval's own error."""
    from orchestrator.evaluation import run_eval

    spec = EvalSpec(tasks=["no_such_task_here"], timeout_s=300)
    with pytest.raises(EvalError) as err:
        run_eval(spec, "http://127.0.0.1:9", "tiny", str(tiny_model_dir), tmp_path, progress=lambda _: None)
    text = str(err.value)
    assert "Tasks not found" in text.splitlines()[0] and "no_such_task_here" in text.splitlines()[0], text[:500]
    assert "last log lines" in text


def test_tasks_no_one_has_are_refused_before_any_server_starts(compose):
    """A local task not shipped, or a name lm-eval does not know (with the closest ones), is a
    config error of the sweep: it was found after the load points had run, when lm-eval did."""
    from orchestrator.config import ConfigError, to_specs
    from orchestrator.evaluation import task_problem
    from orchestrator.trial import check_inputs

    assert task_problem(EvalSpec(tasks=["addition"], local_tasks=True)) is None
    assert task_problem(EvalSpec(tasks=["gsm8k"])) is None
    assert (
        task_problem(EvalSpec(tasks=["gsm8kk"]))
        == "eval.tasks: lm-eval has no task ['gsm8kk'] (closest: gsm8k, gsm8k_cot)"
    )
    spec, _ = to_specs(compose(["eval=addition", "eval.tasks=[nope]"]))
    with pytest.raises(ConfigError, match=r"eval.tasks: no local task \['nope'\] \(shipped: addition\)"):
        check_inputs(spec)


def test_lm_eval_is_stopped_when_the_trial_that_started_it_dies(tmp_path):
    """A Ray worker killed (force-cancel, OOM) while lm-eval runs: the watchdog over lm-eval's
    process group stops it; it was left retrying against a server that was gone."""
    import subprocess
    import sys
    import textwrap
    import time

    import psutil

    owner_script = tmp_path / "owner.py"
    owner_script.write_text(
        textwrap.dedent(
            """
            import subprocess, sys, time
            from orchestrator.evaluation import _guard
            lm_eval = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
            _guard(lm_eval.pid)
            print(lm_eval.pid, flush=True)
            time.sleep(120)
            """
        )
    )
    owner = subprocess.Popen([sys.executable, str(owner_script)], stdout=subprocess.PIPE, text=True)
    pid = int(owner.stdout.readline())
    assert psutil.pid_exists(pid)
    owner.kill()
    owner.wait()

    def gone() -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 30
    while not gone() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert gone(), "lm-eval outlived the trial that started it"
