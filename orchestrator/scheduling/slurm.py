"""SLURM submissions: a Ray cluster inside an allocation, one sweep on it.

    python -m orchestrator.scheduling.slurm --nodes 2 --gpus-per-node 4 --partition gpu \\
        --time 04:00:00 --activate "source ~/venvs/lab/bin/activate" \\
        -- +experiment=chunked_prefill platform=gpu            # prints the sbatch script
    python -m orchestrator.scheduling.slurm ... --submit -- +experiment=NAME platform=gpu   # and sbatch's it

:func:`render_sbatch` is a pure function of :class:`SlurmParams` (unknown parameters are
rejected with the valid list) and the sweep's Hydra overrides; the template is
``slurm/sweep.sbatch.tmpl``. Every value that reaches the script is checked against a
strict pattern or shell-quoted (``shlex.quote``), so a config value can never become shell
code. ``--submit`` first runs the sweep as a dry run here (:mod:`.precheck`), then ``sbatch``
with an argv list. CPUs per node default to a trial's CPUs for each GPU, so every GPU runs one.
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import subprocess
import sys
from pathlib import Path
from string import Template

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, field_validator

from orchestrator.config.errors import ConfigError
from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.scheduling.precheck import local_check, plan_line, reserved_overrides

TEMPLATE = PROJECT_ROOT / "slurm" / "sweep.sbatch.tmpl"
SAFE = re.compile(r"^[A-Za-z0-9_.:@+=/-]+$")  # partition, account, time, mem, names, paths


class SlurmParams(BaseModel):
    """Parameters of one sweep submission."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_name: str = "inference-lab"
    nodes: PositiveInt = 1
    gpus_per_node: int = Field(default=1, ge=0)
    cpus_per_node: PositiveInt | None = Field(
        default=None,
        description="CPUs Ray may hand out per node; default: GPUs per node x the sweep's platform.cpus_per_trial "
        "(every GPU busy), 8 without GPUs",
    )
    mem: str = Field(
        default="64G", pattern=r"^\d+[KMGT]?$", description="memory per node, as sbatch --mem: 64G, 512000M"
    )
    time: str = Field(default="04:00:00", pattern=r"^(\d+-)?\d{1,2}:\d{2}:\d{2}$")
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    activate: str | None = Field(
        default=None,
        description="a shell line run first, e.g. 'source VENV/bin/activate'; default: the environment of the "
        "interpreter that renders the script (its bin folder first on PATH); 'none': no activation",
    )
    workdir: str = str(PROJECT_ROOT)
    log_dir: str = "slurm-logs"
    ray_port: int = Field(default=6379, ge=1024, le=65535)
    head_wait_s: PositiveInt = 15
    join_timeout_s: PositiveInt = 300

    @field_validator("ray_port")
    @classmethod
    def _outside_ray_ranges(cls, v: int) -> int:
        # Ray's own defaults: client server 10001, worker ports 10002-19999, dashboard 8265.
        if 10001 <= v <= 19999 or v == 8265:
            raise ValueError(f"{v} collides with Ray's default ports (8265, 10001-19999)")
        return v

    @field_validator("job_name", "mem", "partition", "account", "qos", "workdir", "log_dir")
    @classmethod
    def _safe(cls, v: str | None) -> str | None:
        if v is not None and not SAFE.match(v):
            raise ValueError(f"{v!r} has characters outside [A-Za-z0-9_.:@+=/-]")
        return v


_FORMS = {
    "mem": "expected a size as sbatch takes it, such as 64G or 512000M",
    "time": "expected HH:MM:SS or D-HH:MM:SS",
}


def params_from(values: dict[str, object]) -> SlurmParams:
    """Validated parameters; an unknown one is an error listing the valid ones."""
    unknown = sorted(set(values) - set(SlurmParams.model_fields))
    if unknown:
        raise ConfigError(
            f"slurm: unknown parameter(s) {', '.join(unknown)}; valid: " + ", ".join(SlurmParams.model_fields)
        )
    try:
        return SlurmParams.model_validate(values)
    except ValidationError as exc:
        # each named as its flag (--gpus-per-node), the way it was given
        problems = "; ".join(
            f"--{'.'.join(map(str, e['loc'])).replace('_', '-')}: "
            f"{_FORMS.get(str(e['loc'][0]), e['msg']) if e['type'] == 'string_pattern_mismatch' else e['msg'].removeprefix('Value error, ')} "
            f"(got {e.get('input')!r})"
            for e in exc.errors()
        )
        raise ConfigError(f"slurm: {problems}") from None


def cpus_per_trial(overrides: list[str]) -> int:
    """``platform.cpus_per_trial`` of the sweep: as overridden, else its platform file's
    (``platform=NAME``, default cpu) in ``conf/platform``."""
    import yaml

    for o in overrides:
        if o.startswith(("platform.cpus_per_trial=", "++platform.cpus_per_trial=", "+platform.cpus_per_trial=")):
            value = o.split("=", 1)[1]
            try:
                return max(1, math.ceil(float(value)))  # a fraction of a CPU still takes one of the node's
            except ValueError:
                raise ConfigError(f"platform.cpus_per_trial: expected a number, got {value!r}") from None
    name = next((o.split("=", 1)[1] for o in overrides if o.startswith("platform=")), "cpu")
    path = PROJECT_ROOT / "conf" / "platform" / f"{name}.yaml"
    if not path.is_file():
        raise ConfigError(f"slurm: platform={name}: no conf/platform/{name}.yaml")
    data = yaml.safe_load(path.read_text()) or {}
    section = data.get("platform", data)  # a global-package file nests it under platform
    return max(1, math.ceil(float(section.get("cpus_per_trial") or 1)))


def node_cpus(params: SlurmParams, overrides: list[str]) -> int:
    """The CPUs a node offers Ray: as given, else one trial's CPUs for each of its GPUs (so that
    every GPU runs a trial: 4 GPUs and 4 CPUs a trial need 16, where a fixed 8 ran two), else 8."""
    if params.cpus_per_node is not None:
        return params.cpus_per_node
    if params.gpus_per_node:
        return params.gpus_per_node * cpus_per_trial(overrides)
    return 8


def render_sbatch(params: SlurmParams, overrides: list[str], template: str | None = None) -> str:
    """The sbatch script for a sweep with these Hydra overrides (``-m`` and the cluster
    address are added by the script)."""
    extra = []
    if params.gpus_per_node:
        extra.append(f"#SBATCH --gpus-per-node={params.gpus_per_node}")
    for key in ("partition", "account", "qos"):
        value = getattr(params, key)
        if value:
            extra.append(f"#SBATCH --{key}={value}")
    bad = reserved_overrides(overrides)
    if bad:
        raise ConfigError(f"slurm: overrides may not contain {', '.join(bad)} (the script adds them)")
    text = template if template is not None else TEMPLATE.read_text()
    return Template(text).substitute(
        job_name=params.job_name,
        nodes=params.nodes,
        gpus_per_node=params.gpus_per_node,
        cpus_per_node=node_cpus(params, overrides),
        mem=params.mem,
        time=params.time,
        log_dir=params.log_dir,
        sbatch_extra="\n".join(extra),
        activate=activation(params.activate),
        workdir=shlex.quote(params.workdir),
        ray_port=params.ray_port,
        head_wait_s=params.head_wait_s,
        join_timeout_s=params.join_timeout_s,
        overrides=" ".join(shlex.quote(o) for o in overrides),
    )


def activation(line: str | None, executable: str = sys.executable) -> str:
    """The script's first shell line: the user's (``--activate``), none (``none``), or by default
    the environment this script is rendered from. On a compute node, ``python`` and ``ray`` are
    otherwise whatever its login PATH finds, rarely the environment the sweep was built in."""
    if line is not None and line.strip().lower() == "none":
        return "# (no environment activation: --activate none)"
    if line:
        return line
    bin_dir = Path(executable).absolute().parent  # a venv's bin: not resolved through its symlink
    return (
        f"# the environment this script was rendered from ({executable}); --activate overrides it\n"
        f'export PATH={shlex.quote(str(bin_dir))}:"$PATH"'  # a substituted value is not read as a template
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="render (and submit) the sbatch script of a sweep")
    for name, field in SlurmParams.model_fields.items():
        ap.add_argument("--" + name.replace("_", "-"), dest=name, default=None, help=field.description)
    ap.add_argument("--out", help="write the script here instead of printing it")
    ap.add_argument("--submit", action="store_true", help="submit it with sbatch (after a local dry run of the sweep)")
    ap.add_argument("--skip-check", action="store_true", help="submit without validating the sweep here first")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides of the sweep, after --")
    a = ap.parse_args(argv)
    values = {k: getattr(a, k) for k in SlurmParams.model_fields if getattr(a, k) is not None}
    try:
        script = render_sbatch(params_from(values), a.overrides)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if a.out or a.submit:
        out = Path(a.out or f"{values.get('log_dir', 'slurm-logs')}/sweep.sbatch")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(script)
        print(f"wrote {out}")
        if a.submit:
            if not a.skip_check:  # a typo fails here, not after the job waited in the queue
                check = local_check(a.overrides)
                if check.returncode != 0:
                    print("error: the sweep does not validate (nothing was submitted):", file=sys.stderr)
                    print(check.stderr.strip()[-4000:], file=sys.stderr)
                    return 2
                print(f"sweep validated locally: {plan_line(check) or '(no plan line)'}")
            Path(values.get("log_dir", "slurm-logs")).mkdir(parents=True, exist_ok=True)
            return subprocess.run(["sbatch", str(out)], check=False).returncode
        return 0
    print(script)
    return 0


if __name__ == "__main__":
    sys.exit(main())
