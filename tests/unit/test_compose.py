"""The sweep composer gives every job the config Hydra composes for it, and Hydra's errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.errors import ConfigCompositionException

from orchestrator.config.convert import config_to_dict
from orchestrator.scheduling.compose import ANY_KEY, SweepComposer, interpolation_inputs
from tests.conftest import CONF, ROOT


@pytest.fixture
def hydra_pair():
    """(a composer, Hydra's own composition of a job) over the project's configs."""
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        master = hydra_compose("config", overrides=[], return_hydra_config=True)

        def by_hydra(overrides):
            return config_to_dict(loader.load_sweep_config(master, list(overrides)))

        yield SweepComposer(loader, master), by_hydra


JOBS = [
    [],
    ["seed=3"],
    ["engine.block_size=32", "seed=1", "dry_run=true"],
    ["workload=long_short", "engine.max_num_seqs=4"],
    ["engine.max_num_seqs=4", "workload=long_short"],
    ["platform.dtype=bfloat16"],  # read by engine.dtype: ${platform.dtype}
    ["platform.dtype=bfloat16", "engine.dtype=float16"],  # set after: the value wins
    ["engine.dtype=float16", "platform.dtype=bfloat16"],
    ["engine.dtype=${platform.enforce_eager}"],  # a value that is an interpolation
    ["+experiment=chunked_prefill", "variant=budget_256"],
    ["+experiment=chunked_prefill", "variant=budget_256", "engine.max_num_batched_tokens=99"],
    ["++seed=5"],
    ["+engine.some_new_key=1"],
    ["+engine.nested.new.key=[1,2]"],
    ["workload.load_points=[{concurrency:2},{concurrency:8}]"],
    ["workload.load_points.0.concurrency=7"],
    ["engine={block_size: 64}", "engine.block_size=16"],  # overlapping keys keep their order
    ["engine.block_size=16", "engine={block_size: 64}"],
    ["~eval"],
    ["platform=gpu", "engine.tensor_parallel_size=2"],
    ["engine=sglang", "seed=2"],
    ["model.cache_dir=null", "seed=4"],
    ["+tag=${seed}", "seed=9"],  # an added interpolation reads a value set after it
    ["hydra.job.chdir=true", "seed=1"],
]


@pytest.mark.parametrize("overrides", JOBS, ids=[" ".join(j) or "(none)" for j in JOBS])
def test_each_job_is_composed_as_hydra_composes_it(hydra_pair, overrides):
    composer, by_hydra = hydra_pair
    assert composer.compose(overrides)[0] == by_hydra(overrides)
    assert composer.counts["by_hydra"] == 0  # made the composer's way, not by falling back to Hydra's
    # Again after other jobs (what the composer keeps must not leak between jobs).
    for other in JOBS[:6]:
        composer.compose(other)
    assert composer.compose(overrides)[0] == by_hydra(overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["engine.blok_size=32"],  # a typo: Hydra's "Could not override"
        ["+seed=3"],  # + on an existing key
        ["workload.load_points.9.concurrency=1"],  # past the list's end
        ["seed=3", "workload.classes.nope.rate=1"],
    ],
)
def test_hydra_errors_are_raised_as_hydra_raises_them(hydra_pair, overrides):
    composer, by_hydra = hydra_pair
    with pytest.raises(ConfigCompositionException) as theirs:
        by_hydra(overrides)
    with pytest.raises(ConfigCompositionException) as ours:
        composer.compose(overrides)
    assert str(ours.value) == str(theirs.value)


def test_a_grid_is_composed_once_per_set_of_config_groups(hydra_pair):
    composer, by_hydra = hydra_pair
    jobs = [
        [f"workload={w}", f"engine.block_size={b}", f"seed={s}"]
        for w in ("short_short", "long_short")
        for b in (32, 64)
        for s in range(10)
    ]
    out = [composer.compose(j)[0] for j in jobs]
    assert composer.counts == {"structural": 2, "interpolated": 2, "checked": 2, "by_hydra": 0, "plain": 40}
    assert [(d["seed"], d["engine"]["block_size"]) for d in out[:3]] == [(0, 32), (1, 32), (2, 32)]
    assert out[-1] == by_hydra(jobs[-1])
    first = by_hydra(jobs[0])
    assert out[0] == first  # the later jobs left the first one's dict as it was


def test_a_config_reading_hydra_job_fields_is_composed_by_hydra_per_job(hydra_pair):
    composer, by_hydra = hydra_pair
    data, cfg = composer.compose(["+tag=${hydra:job.num}"], index=7)
    assert data["tag"] == 7 and cfg.hydra.job.id == "job7"
    assert composer.counts["by_hydra"] == 1


def test_interpolation_inputs():
    assert interpolation_inputs("${platform.dtype}") == {"platform.dtype"}
    assert interpolation_inputs("${sweeps.${platform.name}}") == {"sweeps", "platform.name"}
    assert interpolation_inputs("${oc.env:X,${project_root:}/data}") == set()
    assert interpolation_inputs("${now:%Y}") == set()
    assert interpolation_inputs("${hydra:job.num}") == {"hydra"}
    assert interpolation_inputs("${oc.select:a.b,1}") == {ANY_KEY}
    assert interpolation_inputs("${..sibling}") == {ANY_KEY}
    assert interpolation_inputs("plain text") == set()


def test_a_dry_run_of_a_grid_prints_the_same_plan_as_hydra_composing_every_job(tmp_path):
    """The CLI end to end: the default sweeper (grid, composed once per config-group set) and
    Hydra's basic sweeper (every job composed twice) print the same lines."""
    args = ["dry_run=json", "workload=short_short,long_short", "engine.block_size=32,64", "seed=0,1", "-m"]

    def lines(*extra):
        p = subprocess.run(
            [sys.executable, "-m", "orchestrator", *extra, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, p.stderr
        return [json.loads(x) for x in p.stdout.splitlines() if x.startswith("{")]

    ours, basic = lines(), lines("hydra/sweeper=basic")
    assert len(ours) == 9 and ours == basic


# Found in review: each was a job the composer made differently from Hydra, or an error it
# raised where Hydra did not (or the reverse). Each list of jobs goes through one composer.
REVIEWED = [
    # an interpolation with a list index reads a value the jobs set
    [
        ["+tag=${workload.load_points[0].concurrency}", "workload.load_points.0.concurrency=1"],
        ["+tag=${workload.load_points[0].concurrency}", "workload.load_points.0.concurrency=7"],
    ],
    # the resolved base cannot resolve without the job's own value
    [["~platform.dtype", "engine.dtype=float16"]],
    # + and ~ on an interpolated node: Hydra's checks read the interpolation's value
    [["+engine.dtype=x", "platform.dtype=null"]],
    [["platform.dtype=bfloat16", "~engine.dtype=bfloat16"]],
    # an error that depends on the value, not on the shape of the job
    [
        ["model.cache_dir=null", "+model.cache_dir=/x"],
        ["model.cache_dir=/tmp", "+model.cache_dir=/x"],
    ],
    [
        [
            "workload.load_points=[{concurrency:1},{concurrency:2},{concurrency:3}]",
            "workload.load_points.2.concurrency=5",
        ],
        ["workload.load_points=[{concurrency:1}]", "workload.load_points.2.concurrency=5"],
    ],
    # a key inside an interpolated container
    [["+alias=${workload.slo}", "++alias.ttft_ms=5"], ["+alias=${workload.slo}", "++alias.ttft_ms=7"]],
    # a parse error
    [["seed=[1,"]],
]


def _outcome(fn, overrides):
    try:
        return fn(overrides)
    except Exception as exc:  # compare the error as Hydra reports it
        return (type(exc).__name__, str(exc))


@pytest.mark.parametrize("jobs", REVIEWED, ids=[" | ".join(" ".join(j) for j in js) for js in REVIEWED])
def test_reviewed_cases_match_hydra(hydra_pair, jobs):
    composer, by_hydra = hydra_pair
    for overrides in jobs:
        assert _outcome(lambda o: composer.compose(o)[0], overrides) == _outcome(by_hydra, overrides)


def test_oc_decode_may_read_keys(monkeypatch, hydra_pair):
    composer, by_hydra = hydra_pair
    monkeypatch.setenv("TEST_DECODED", "${seed}")
    for seed in (0, 5):
        job = ["+tag='${oc.decode:${oc.env:TEST_DECODED}}'", f"seed={seed}"]
        assert composer.compose(job)[0] == by_hydra(job)
        assert composer.compose(job)[0]["tag"] == seed


def test_a_searchpath_per_job_is_composed_by_hydra(tmp_path, hydra_pair):
    composer, by_hydra = hydra_pair
    (tmp_path / "foo").mkdir()
    (tmp_path / "foo" / "bar.yaml").write_text("a: 1\n")
    job = [f"hydra.searchpath=[file://{tmp_path}]", "+foo=bar"]
    assert composer.compose(job)[0] == by_hydra(job)
    assert by_hydra(job)["foo"] == {"a": 1}
