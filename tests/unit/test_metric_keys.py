"""Metric names are defined once (orchestrator/config/metric_keys.py): code reads them by constant,
never by a string literal (a typo would read nothing); the registry agrees with the engines' and
the diagnosis's own lists; a config that names an unknown metric fails before anything starts."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from orchestrator.config import to_specs
from orchestrator.config.errors import ConfigError
from orchestrator.config.metric_keys import (
    LIMITERS,
    SERVER_COUNTERS,
    SERVER_GAUGES,
    SERVER_HISTOGRAMS,
    SERVER_LATENCIES,
    STALL_CAUSES,
    M,
    check_name,
    is_known,
)

PACKAGE = Path(__file__).resolve().parents[2] / "orchestrator"
KEYS = PACKAGE / "config" / "metric_keys.py"

# Names of dicts that hold metrics (``metrics``, ``p.metrics``, ``x.class_metrics``, ``m``...): a
# string literal as their key is a read (or write) that no check sees. Use ``M.<NAME>``.
METRIC_DICTS = {"metrics", "class_metrics", "client_stats", "m", "cm", "sm", "stats", "merged"}

# String literals that equal a metric's name but are something else; everything else that names
# a metric must be ``M.<NAME>`` (or built from a family in metric_keys).
NOT_METRICS = {
    "config/hashing.py": {"client_nodes", "client_processes"},  # workload config keys
    "config/schema/workload.py": {"input_tokens", "output_tokens"},  # config fields
    "config/schema/load.py": {"trace_block_tokens"},  # a config field
    "loadgen/datasets.py": {"input_tokens", "output_tokens"},  # a trace file's columns
    "metrics/records.py": {"output_tokens"},  # a record's column
    "decide/capacity.py": {"invalid"},  # a probe's verdict
    "trial/capacity_probes.py": {"invalid"},  # a probe's verdict
    "trial/admission.py": {"client_processes"},  # the trial plan's field
    "scheduling/preview.py": {"server_starts"},  # the preview's count
    "metrics/probes.py": {"energy_j"},  # a telemetry row's name
    "gpu_check.py": {"energy_j"},  # a telemetry row's name
    "metrics/telemetry.py": {"energy_j"},  # a telemetry row's name
    "metrics/diagnosis/__init__.py": {"stalls"},  # the rules' state: the list of stalls
    "metrics/diagnosis/rules.py": {"stalls"},  # the rules' state: the list of stalls
    "metrics/diagnosis/findings.py": {"stalls"},  # a diagnosis's JSON: its worst stalls
    "report/timeline.py": {"stalls"},  # a diagnosis's JSON: its worst stalls
    "tracking/mlflow_tracker.py": {"stalls", "invalid"},  # a diagnosis's JSON; words
    "report/build.py": {"invalid"},  # words
    "report/explain.py": {"stalls"},  # words
}


def _modules() -> list[tuple[str, ast.Module]]:
    return [(str(p.relative_to(PACKAGE)), ast.parse(p.read_text())) for p in sorted(PACKAGE.rglob("*.py")) if p != KEYS]


def _terminal(node: ast.expr) -> str | None:
    """``metrics`` for ``metrics``, ``p.metrics``, ``t.points[-1].metrics``."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _literal_keys(tree: ast.Module) -> list[tuple[int, str, str]]:
    """(line, receiver, key) of every string literal used as a key of a dict: ``d["k"]``,
    ``d.get("k", ...)`` (also pop, setdefault) and ``"k" in d``."""
    out = []
    for node in ast.walk(tree):
        found: list[tuple[ast.expr, ast.expr]] = []
        if isinstance(node, ast.Subscript):
            found.append((node.value, node.slice))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            if node.func.attr in ("get", "pop", "setdefault"):
                found.append((node.func.value, node.args[0]))
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
            found.append((node.comparators[0], node.left))
        for receiver, key in found:
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out.append((node.lineno, _terminal(receiver) or "", key.value))
    return out


def _string_literals(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, value) of every string constant but docstrings and the text of f-strings."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                skip.add(id(body[0].value))
        if isinstance(node, ast.JoinedStr):
            skip |= {id(v) for v in node.values if isinstance(v, ast.Constant)}
    return [
        (n.lineno, n.value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in skip
    ]


def test_no_metric_dict_is_read_by_a_string_literal():
    found = [
        f"{path}:{line}: {receiver}[{key!r}]"
        for path, tree in _modules()
        for line, receiver, key in _literal_keys(tree)
        if receiver in METRIC_DICTS
    ]
    assert found == [], "read metrics by M.<NAME> (orchestrator/config/metric_keys.py):\n" + "\n".join(found)


def test_no_metric_name_is_spelt_out_of_the_registry():
    found = [
        f"{path}:{line}: {value!r} -> M.{value.upper()}"
        for path, tree in _modules()
        for line, value in _string_literals(tree)
        if is_known(value) and value not in NOT_METRICS.get(path, ())
    ]
    assert found == [], "name metrics by M.<NAME> (orchestrator/config/metric_keys.py):\n" + "\n".join(found)


def test_the_rule_catches_a_typo_at_a_read_site():
    tree = ast.parse("x = p.metrics.get('tpot_ms_p5O')\ny = metrics['qps']\nz = 'slo_met' in t.metrics\nw = d['qps']")
    assert [(r, k) for _, r, k in _literal_keys(tree)] == [
        ("metrics", "tpot_ms_p5O"),
        ("metrics", "qps"),
        ("metrics", "slo_met"),
        ("d", "qps"),
    ]


def test_the_constants_are_known_names():
    values = {k: v for k, v in vars(M).items() if k.isupper()}
    assert all(is_known(v) for v in values.values())
    assert all(k == v.upper() for k, v in values.items())  # M.TTFT_MS_P50 is "ttft_ms_p50"


@pytest.mark.parametrize(
    "name, known",
    [
        ("ttft_ms_p99", True),
        ("short/itl_ms_p99", True),
        ("tokens_per_second_ci95", True),
        ("server_decode_ttft_ms_p50_high", True),
        ("server_spec_decode_acceptance_rate", True),
        ("limited_by_prefill_interference", True),
        ("slo_capacity_rps_censored", True),
        ("slo_capacity_cost_per_mtok_output", True),
        ("eval_gsm8k_exact_match_strict_match", True),
        ("stall_worst_ms_client_read", True),
        ("ttft_parts_kv_transfer_share", True),
        ("ttft_ms_p98", False),
        ("tokens_per_secnd", False),
        ("server_nonsense", False),
        ("limited_by_gremlins", False),
        ("eval_", False),
    ],
)
def test_is_known(name, known):
    assert is_known(name) is known


def test_the_engines_neutral_names_are_listed():
    from orchestrator.engines import external, sglang, vllm
    from orchestrator.metrics.monitor import TIMELINE_COUNTERS

    by_kind = {
        "counter": SERVER_COUNTERS,
        "gauge": SERVER_GAUGES,
        "histogram": SERVER_HISTOGRAMS,
        "latency": SERVER_LATENCIES,
    }
    maps = [vllm.METRICS, sglang.METRICS, *external.METRICS_BY_FLAVOR.values()]
    missing = [(n, m.kind) for table in maps for n, m in table.items() if n not in by_kind[m.kind]]
    assert missing == [], "add these neutral names to orchestrator/config/metric_keys.py"
    assert set(TIMELINE_COUNTERS) <= set(SERVER_COUNTERS)


def test_the_diagnosis_vocabularies_are_the_registrys():
    from orchestrator.metrics.diagnosis import PRIORITY, VOCABULARY
    from orchestrator.metrics.stalls import CAUSES

    assert set(VOCABULARY) == set(LIMITERS) and set(PRIORITY) | {"none"} == set(LIMITERS)
    assert CAUSES == STALL_CAUSES


def test_check_name_says_the_key_the_name_and_the_closest():
    check_name("objective.maximize", "engine.max_num_batched_tokens")  # a knob
    check_name("objective.show[0]", "long/ttft_ms_p99")
    with pytest.raises(ValueError, match=r"objective.show\[1\]: unknown metric 'tpot_ms_p05'.*tpot_ms_p50"):
        check_name("objective.show[1]", "tpot_ms_p05")
    with pytest.raises(ValueError, match="engine, model, workload"):
        check_name("objective.minimize", "engin.max_num_seqs")
    with pytest.raises(ValueError, match="unknown metric"):
        check_name("expect.metric", "engine.max_num_seqs", knobs=False)


# ------------------------------------------------------------------------ the config's names


@pytest.mark.parametrize(
    "override, where, bad, near",
    [
        ("+objective={maximize:tokens_per_secnd}", "objective.maximize", "tokens_per_secnd", "tokens_per_second"),
        (
            "+objective={minimize:engine.max_num_batched_tokens,subject_to:{long/ttft_ms_p999:2000}}",
            "objective.subject_to.long/ttft_ms_p999",
            "long/ttft_ms_p999",
            "ttft_ms_p99",
        ),
        ("+objective={maximize:qps,show:[qps,itl_ms_p99x]}", r"objective.show\[1\]", "itl_ms_p99x", "itl_ms_p99"),
        (
            "+objective={maximize:qps,frontier:{maximize:qps,minimize:ttft_p50}}",
            "objective.frontier.minimize",
            "ttft_p50",
            "ttft_ms_p50",
        ),
        (
            "+expect=[{claim:c,metric:'server_requests_running_max / decode_batch_men',above:1}]",
            r"expect\[0\].metric",
            "decode_batch_men",
            "decode_batch_mean",
        ),
        ("+expect=[{claim:c,limiter:prefill_interferance}]", r"expect\[0\].limiter", "prefill_interferance", None),
    ],
)
def test_a_config_naming_an_unknown_metric_fails_with_the_closest_names(compose, override, where, bad, near):
    with pytest.raises(ConfigError) as err:
        to_specs(compose([override]))
    text = str(err.value)
    assert where.replace("\\", "") in text and repr(bad) in text, text
    assert near is None or near in text.split("closest")[1], text


def test_a_config_naming_known_metrics_and_knobs_validates(compose):
    _, settings = to_specs(
        compose(
            [
                "+objective={minimize:engine.max_num_batched_tokens,subject_to:{long/ttft_ms_p99:2000,"
                "accuracy:base-0.01},show:[tokens_per_second_ci95,eval_gsm8k_exact_match],"
                "frontier:{maximize:slo_capacity_rps,minimize:cost_per_mtok_output}}",
                "+expect=[{claim:c,metric:'server_requests_running_max / decode_batch_mean',above:1},"
                "{claim:d,limiter:[prefill_interference,none]}]",
            ]
        )
    )
    assert settings.objective is not None and len(settings.expect) == 2


def test_the_search_checks_its_objectives_names():
    from omegaconf import OmegaConf

    from orchestrator.scheduling.search import objective_of

    assert objective_of(OmegaConf.create({"objective": {"maximize": "qps"}})).key == "qps"
    with pytest.raises(ConfigError, match="objective.maximize: unknown metric 'qsp'"):
        objective_of(OmegaConf.create({"objective": {"maximize": "qsp"}}))
