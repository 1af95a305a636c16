"""Every lab's figure builder (report/plots.py) on data shaped like that lab's sweep: the
figure is drawn from the right numbers (read back from the figure's own lines), not only a
file. A broken builder is only a warning in a sweep's report, so this is where it must fail."""

from __future__ import annotations

import math

import pytest

from orchestrator.decide.trials import Point, SweepData, TrialData
from orchestrator.report import plots
from orchestrator.report.plots import LAB_PLOTS


@pytest.fixture
def drawn(monkeypatch, tmp_path):
    """The figures the builders save, by file name (each is still written)."""
    from orchestrator.report import figures

    saved: dict[str, object] = {}
    real = figures.save_figure

    def keep(fig, out, name):
        saved[name] = fig
        fig.canvas.draw()
        return real(fig, out, name)

    monkeypatch.setattr(plots, "save_figure", keep)
    monkeypatch.setattr(figures, "save_figure", keep)
    return saved


def _lines(fig, panel=0):
    """{legend label: (xs, ys)} of one panel of a figure."""
    ax = fig.axes[panel]
    return {
        line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


def _trial(name, params, points, metrics=None):
    return TrialData(name, "FINISHED", {k: str(v) for k, v in params.items()}, metrics or {}, points)


def _pt(i, setting, **m):
    return Point(i, "c" + str(setting.get("concurrency", i)), setting, m)


def test_every_lab_has_a_builder_and_each_is_tested_here():
    tested_in_test_report = {"first_serving", "chunked_prefill"}
    tested_here = {
        "prefix_caching",
        "speculative_decoding",
        "quantization",
        "tensor_parallel",
        "disaggregated_pd",
        "serving_workloads",
        "multi_lora",
    }
    assert set(LAB_PLOTS) == tested_in_test_report | tested_here  # a new lab's builder needs its test


def test_prefix_caching_plots_ttft_against_prefix_length_on_and_off(drawn, tmp_path):
    trials = [
        _trial(
            f"{'on' if on else 'off'}-{prefix}",
            {"engine.enable_prefix_caching": on, "workload.classes.main.prefix_tokens": prefix},
            [_pt(0, {"concurrency": 4}, ttft_ms_p50=ttft, server_prefix_cache_hit_rate=hit)],
        )
        for on, prefix, ttft, hit in (
            (True, 0, 200.0, 0.0),
            (True, 512, 90.0, 0.8),
            (False, 0, 210.0, 0.0),
            (False, 512, 400.0, 0.0),
        )
    ]
    (path,) = LAB_PLOTS["prefix_caching"](SweepData("prefix_caching", trials, "results"), tmp_path)
    lines = _lines(drawn[path.name])
    assert lines == {
        "prefix caching off": ([0.0, 512.0], [210.0, 400.0]),
        "prefix caching on": ([0.0, 512.0], [200.0, 90.0]),
    }
    assert "hit 80%" in {t.get_text() for t in drawn[path.name].axes[0].texts}


def test_speculative_decoding_plots_acceptance_against_k_and_latency_against_qps(drawn, tmp_path):
    trials = [
        _trial(
            f"k{k}",
            {"engine.speculative_config.num_speculative_tokens": k},
            [
                _pt(0, {"concurrency": 1}, server_spec_decode_acceptance_rate=acc, qps=1.0 * k, tpot_ms_p50=10.0 + k),
                _pt(
                    1,
                    {"concurrency": 8},
                    server_spec_decode_acceptance_rate=acc - 0.1,
                    qps=4.0 * k,
                    tpot_ms_p50=20.0 + k,
                ),
            ],
        )
        for k, acc in ((1, 0.9), (3, 0.7), (5, 0.5))
    ]
    (path,) = LAB_PLOTS["speculative_decoding"](SweepData("speculative_decoding", trials, "results"), tmp_path)
    fig = drawn[path.name]
    acceptance = _lines(fig, 0)
    assert acceptance["c1"] == ([1.0, 3.0, 5.0], [0.9, 0.7, 0.5])
    assert acceptance["c8"][1] == pytest.approx([0.8, 0.6, 0.4])
    assert _lines(fig, 1)["k3"] == ([3.0, 12.0], [13.0, 23.0])


def test_quantization_plots_memory_against_throughput_with_the_pareto_front(drawn, tmp_path):
    trials = [
        _trial(
            name, {}, [_pt(0, {"concurrency": 4}, tokens_per_second=tps)], {"memory_peak_gb_max": mem, "accuracy": acc}
        )
        for name, mem, tps, acc in (
            ("fp16", 16.0, 900.0, 0.71),
            ("int8", 9.0, 1000.0, 0.70),
            ("int4", 5.0, 700.0, 0.62),
        )
    ]
    (path,) = LAB_PLOTS["quantization"](SweepData("quantization", trials, "results"), tmp_path)
    fig = drawn[path.name]
    ax = fig.axes[0]
    assert sorted(tuple(c.get_offsets()[0]) for c in ax.collections) == [(5.0, 700.0), (9.0, 1000.0), (16.0, 900.0)]
    assert _lines(fig)["Pareto front"] == ([5.0, 9.0], [700.0, 1000.0])  # fp16 is dominated by int8
    assert "int8 (acc 0.700)" in {t.get_text() for t in ax.texts}


def test_multi_lora_plots_throughput_ttft_and_cold_against_warm_adapters(drawn, tmp_path):
    def adapters(cold, warm):
        return {
            f"adapter.{name}.{k}": v
            for name in ("lora-a", "lora-b")
            for k, v in (("first_ttft_ms", cold), ("warm_ttft_ms_p50", warm))
        } | {"adapter.base.first_ttft_ms": 1.0}  # the base model's: not an adapter's cold start

    trials = [
        _trial(
            name,
            {"workload.adapters.active": active, "engine.max_loras": 2},
            [
                _pt(
                    0,
                    {"concurrency": 8},
                    tokens_per_second=tps,
                    ttft_ms_p50=t50,
                    ttft_ms_p99=t99,
                    **adapters(cold, warm),
                )
            ],
        )
        for name, active, tps, t50, t99, cold, warm in (
            ("active_2", 2, 300.0, 40.0, 90.0, 120.0, 40.0),
            ("active_8", 8, 200.0, 80.0, 400.0, 300.0, 70.0),
        )
    ]
    (path,) = LAB_PLOTS["multi_lora"](SweepData("multi_lora", trials, "results"), tmp_path)
    fig = drawn[path.name]
    assert [b.get_height() for b in fig.axes[0].patches] == [300.0, 200.0]
    assert _lines(fig, 1)["TTFT p99"] == ([0, 1], [90.0, 400.0])
    cold_warm = [b.get_height() for b in fig.axes[2].patches]
    assert cold_warm == [120.0, 300.0, 40.0, 70.0]  # the adapters' mean first-request TTFT, then warm
    assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [
        "active_2\n2 active\n2 slots",
        "active_8\n8 active\n2 slots",
    ]


@pytest.mark.parametrize(
    ("lab", "key"),
    [("tensor_parallel", "engine.tensor_parallel_size"), ("disaggregated_pd", "workload.classes.main.input_tokens")],
)
def test_knob_labs_plot_each_load_point_against_the_knob(drawn, tmp_path, lab, key):
    trials = [
        _trial(
            f"v{v}",
            {key: v},
            [_pt(0, {"concurrency": 4}, ttft_ms_p50=100.0 * v, tpot_ms_p50=10.0 / v, tokens_per_second=50.0 * v)],
        )
        for v in (4, 1, 2)  # sorted by the knob in the figure
    ]
    (path,) = LAB_PLOTS[lab](SweepData(lab, trials, "results"), tmp_path)
    fig = drawn[path.name]
    assert _lines(fig, 0)["c4"] == ([1.0, 2.0, 4.0], [100.0, 200.0, 400.0])
    assert _lines(fig, 1)["c4"] == ([1.0, 2.0, 4.0], [10.0, 5.0, 2.5])
    assert _lines(fig, 2)["c4"] == ([1.0, 2.0, 4.0], [50.0, 100.0, 200.0])


def test_serving_workloads_plots_one_line_per_workload_against_load(drawn, tmp_path):
    trials = [
        _trial(
            name,
            {"workload.name": name},
            [
                _pt(i, {"rate": r}, ttft_ms_p50=t, tpot_ms_p50=tp, tokens_per_second=s)
                for i, (r, t, tp, s) in enumerate(pts)
            ],
        )
        for name, pts in (
            ("chat", [(1.0, 120.0, 12.0, 100.0), (4.0, 300.0, 15.0, 350.0)]),
            ("rag", [(1.0, 400.0, 13.0, 90.0), (math.inf, 2000.0, 30.0, 500.0)]),
        )
    ]
    (path,) = LAB_PLOTS["serving_workloads"](SweepData("serving_workloads", trials, "results"), tmp_path)
    fig = drawn[path.name]
    ttft = _lines(fig, 0)
    assert ttft["chat"] == ([1.0, 4.0], [120.0, 300.0])
    assert ttft["rag"] == ([1.0, 4.0 * 1.6], [400.0, 2000.0])  # inf drawn right of the largest finite rate
    assert _lines(fig, 2)["rag"][1] == [90.0, 500.0]
