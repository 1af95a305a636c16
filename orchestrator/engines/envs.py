"""Which interpreter runs an engine's servers, and with what in front of it.

GPU engines live in their own virtualenvs, never in the orchestrator's: vLLM's CUDA build
(with LMCache and NIXL) and SGLang (with its router) pin different torch builds and cannot
share one environment. ``make engines-gpu`` creates them from the pinned lists in
``engines/`` under ``<project>/.engines`` (or ``$INFERENCE_LAB_ENGINES``, or
``platform.engine_envs``); on ``platform=gpu`` each adapter launches its servers with its
environment's interpreter. ``engine.python`` overrides that, and ``engine.launch_prefix``
(``apptainer exec --nv IMAGE``, ``srun --container-image=IMAGE``) runs the server inside a
container, whose own ``python3`` is then the interpreter. On the CPU platform the engine is
vLLM's CPU build in the orchestrator's own environment.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata
from pathlib import Path

from orchestrator.config.paths import PROJECT_ROOT
from orchestrator.config.schema import LaunchedEngineSpec, TrialSpec, VLLMEngineSpec
from orchestrator.engines import nsys

ENV_VAR = "INFERENCE_LAB_ENGINES"
# Engine name -> environment folder name (under the engines folder) and the command that creates it.
ENVIRONMENTS = {"vllm": "vllm-gpu", "sglang": "sglang-gpu"}
CREATE_COMMAND = "make engines-gpu"
CONTAINER_PYTHON = "python3"


def engines_dir(spec: TrialSpec) -> Path:
    configured = spec.platform.engine_envs or os.environ.get(ENV_VAR)
    return Path(configured).expanduser() if configured else PROJECT_ROOT / ".engines"


def environment(spec: TrialSpec) -> Path | None:
    """The engine's own virtualenv on this platform, or None (CPU platform, or no such engine)."""
    name = ENVIRONMENTS.get(spec.engine.name)
    if name is None or spec.platform.device != "cuda":
        return None
    return engines_dir(spec) / name


def _configured(spec: TrialSpec) -> tuple[str | None, list[str]]:
    engine = spec.engine
    if not isinstance(engine, LaunchedEngineSpec):
        return None, []
    return engine.python, [str(a) for a in engine.launch_prefix]


def interpreter(spec: TrialSpec) -> str:
    """The interpreter of the engine's servers (not of our proxy, which runs in this environment)."""
    python, prefix = _configured(spec)
    if python:
        return python
    if prefix:
        return CONTAINER_PYTHON  # resolved inside the container
    env = environment(spec)
    return str(env / "bin" / "python") if env is not None else sys.executable


def command(spec: TrialSpec, module: str) -> list[str]:
    """``[*launch_prefix, interpreter, -m, module]``: the head of every engine server's argv."""
    _, prefix = _configured(spec)
    return [*prefix, interpreter(spec), "-m", module]


ROUTER_ENVIRONMENT = "sglang-gpu"  # the SGLang router (PyPI sglang-router) lives with SGLang


def helper_command(spec: TrialSpec, module: str, environment_name: str) -> list[str]:
    """The argv head of a helper process (a router) whose package lives in the GPU environment
    ``environment_name``. One rule for every helper: when that is the engine's own environment,
    the helper runs exactly as the engine's servers do (:func:`command`: launch prefix,
    configured interpreter); otherwise it runs in that environment on GPUs, and in this one on
    the CPU (the project's cpu extra has what it needs), never behind the engine's launch
    prefix, whose container does not hold it. Our own proxy is not a helper of this kind: it
    is orchestrator code and runs with this interpreter."""
    if ENVIRONMENTS.get(spec.engine.name) == environment_name:
        return command(spec, module)
    if spec.platform.device == "cuda":
        return [str(engines_dir(spec) / environment_name / "bin" / "python"), "-m", module]
    return [sys.executable, "-m", module]


def missing(spec: TrialSpec) -> str | None:
    """Why the engine's interpreter cannot be used here, or None. Checked before anything starts:
    a container's interpreter (behind a launch prefix) is not looked for on this host."""
    python, prefix = _configured(spec)
    no_nsys = nsys.missing_on_host(spec)
    if no_nsys:
        return no_nsys
    if prefix:
        return None
    if python:
        if os.sep in python and not Path(python).expanduser().exists():
            return f"engine.python: '{python}' does not exist"
        return None
    env = environment(spec)
    router = engines_dir(spec) / ROUTER_ENVIRONMENT
    if (
        isinstance(spec.engine, VLLMEngineSpec)
        and spec.engine.router is not None
        and spec.platform.device == "cuda"
        and not (router / "bin" / "python").exists()
    ):
        return (
            f"the SGLang router's environment is missing: {router} (engine.router runs sglang-router from "
            f"it). Create it with `{CREATE_COMMAND}` or point platform.engine_envs at it"
        )
    if env is None or (env / "bin" / "python").exists():
        return None
    return (
        f"the {spec.engine.name} engine environment is missing: {env} (platform=gpu launches "
        f"{spec.engine.name} from its own virtualenv). Create it with `{CREATE_COMMAND}`, point "
        f"platform.engine_envs (or ${ENV_VAR}) at the folder holding it, or set engine.python / "
        "engine.launch_prefix"
    )


def package_version(spec: TrialSpec, *dists: str) -> str:
    """``dist==version`` of the first of ``dists`` installed where the engine runs: its own
    environment on GPUs (read from that environment's metadata, nothing imported), else here."""
    env = environment(spec)
    python, prefix = _configured(spec)
    path: list[str] | None = None
    if env is not None and not python and not prefix:
        path = [str(p) for p in sorted(env.glob("lib/python3*/site-packages"))]
    for dist in dists:
        try:
            if path is None:
                return f"{dist}=={metadata.version(dist)}"
            found = next(iter(metadata.distributions(name=dist, path=path)), None)
            if found is not None:
                return f"{dist}=={found.version}"
        except metadata.PackageNotFoundError:
            continue
    return "unknown"
