"""What a tool's log says went wrong: the cause line first (orchestrator/config/logs.py)."""

from __future__ import annotations

from orchestrator.config.logs import cause_line, explain

# Lines of a real vLLM 0.32 CPU server log whose engine died on its first request (W4A16 on an
# AVX2 CPU, 2026-11-24), trimmed.
VLLM_DEATH = """\
(APIServer pid=5570) WARNING 11-24 01:47:19 [system_utils.py:255] Found ulimit of 20000 and failed to automatically increase with error current limit exceeds maximum limit. This can cause fd limit errors like `OSError: [Errno 24] Too many open files`. Consider increasing with ulimit -n
(Worker pid=5612) ERROR 11-24 01:47:48 [multiproc_executor.py:1063]     raise AttributeError(
(Worker pid=5612) ERROR 11-24 01:47:48 [multiproc_executor.py:1063] AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'
(EngineCore pid=5592) ERROR 11-24 01:47:48 [core.py:1512] EngineCore encountered a fatal error.
(EngineCore pid=5592) ERROR 11-24 01:47:48 [core.py:1512] RuntimeError: Worker failed with error ''_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'', please check the stack trace above for the root cause
(APIServer pid=5570) ERROR 11-24 01:47:48 [async_llm.py:906] vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See stack trace (above) for the root cause.
INFO:     127.0.0.1:56802 - "POST /v1/completions HTTP/1.1" 500 Internal Server Error
INFO:     Shutting down
"""

# The end of lm-eval's log when its task folder was not found (the issue-19 run).
LM_EVAL_TASKS = """\
2026-11-24:01:45:10 WARNING  [lm_eval.api.registry] some warning
Traceback (most recent call last):
  File "/x/lm_eval/config/evaluate_config.py", line 477, in process_tasks
    raise ValueError(f"Tasks not found: {missing}")
ValueError: Tasks not found: addition
"""


def test_an_engine_death_is_named_by_its_root_cause():
    assert cause_line(VLLM_DEATH) == "AttributeError: '_OpNamespace' '_C' object has no attribute 'cpu_gemm_wna16'"


def test_a_tools_failure_is_named_by_its_last_raise():
    assert cause_line(LM_EVAL_TASKS, last=True) == "ValueError: Tasks not found: addition"


def test_only_wrappers_still_give_a_line():
    assert cause_line("vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue.\n").startswith(
        "vllm.v1.engine.exceptions.EngineDeadError"
    )
    assert cause_line("all fine\n") is None


def test_explain_puts_the_cause_first(tmp_path):
    log = tmp_path / "eval.log"
    log.write_text(LM_EVAL_TASKS)
    text = explain(log, last=True)
    assert text.splitlines()[0] == "ValueError: Tasks not found: addition"
    assert "last log lines" in text and text.rstrip().endswith("ValueError: Tasks not found: addition")
    log.write_text("starting\nsomething odd happened\n\n")
    assert explain(log).splitlines()[0] == "something odd happened"  # no exception: the last line said
    assert explain(tmp_path / "missing.log").startswith("no log at")
