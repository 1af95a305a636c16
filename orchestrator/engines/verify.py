"""Our generated commands and config files, checked by the engines' own code where they run.

Each server launch is turned into an item for :mod:`orchestrator.engines.enginecheck`, which
runs under the engine's interpreter (its GPU environment on ``platform=gpu``): vLLM's serve
parser + ``EngineArgs`` + ``KVTransferConfig``, SGLang's ``ServerArgs``, the router's CLI,
LMCache's config loader. One subprocess per interpreter checks any number of launches.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.errors import OrchestratorError
from orchestrator.engines import sglang, vllm
from orchestrator.engines.base import ServerLaunch
from orchestrator.engines.router import ROUTER_MODULE

CHECKER = Path(__file__).with_name("enginecheck.py")
KINDS = {
    vllm.SERVER_MODULE: "vllm",
    sglang.SERVER_MODULE: "sglang",
    ROUTER_MODULE: "router",
}


@dataclass(frozen=True)
class Check:
    """One thing to check: a server's argv or a rendered file, and the interpreter to check it with."""

    python: str
    kind: str
    payload: dict[str, Any]
    what: str  # for messages: "prefill argv", "lmcache.yaml of server", ...


def checks_for(launch: ServerLaunch) -> list[Check]:
    """What of ``launch`` the engine's own code can check (nothing for our proxy and external servers)."""
    argv = launch.argv
    # "-m MODULE" after the interpreter; a launch prefix may hold a "-m" of its own (srun -m ...)
    at = next((i for i in range(1, len(argv) - 1) if argv[i] == "-m" and argv[i + 1] in KINDS), None)
    if at is None:
        return []
    kind = KINDS[argv[at + 1]]
    python = argv[at - 1]
    out = [Check(python, kind, {"argv": argv[at + 2 :]}, f"{launch.name} argv")]
    for path, text in launch.files.items():
        if path.endswith("lmcache.yaml"):
            out.append(Check(python, "lmcache", {"text": text}, f"{Path(path).name} of {launch.name}"))
    return out


def run_checks(checks: list[Check], timeout_s: float = 600.0) -> list[dict[str, Any]]:
    """Results in the order of ``checks`` (``ok``, ``error`` or ``detail``, ``versions``)."""
    results: list[dict[str, Any] | None] = [None] * len(checks)
    by_python: dict[str, list[int]] = {}
    for i, c in enumerate(checks):
        by_python.setdefault(c.python, []).append(i)
    for python, idx in by_python.items():
        items = [{"kind": checks[i].kind, **checks[i].payload} for i in idx]
        try:
            proc = subprocess.run(
                [python, str(CHECKER)],
                input=json.dumps(items),
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OrchestratorError(f"could not run the engine check with {python}: {exc}") from None
        try:
            out = json.loads(proc.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            raise OrchestratorError(
                f"the engine check with {python} failed (exit {proc.returncode}): {proc.stderr.strip()[-2000:]}"
            ) from None
        for i, r in zip(idx, out["results"]):
            results[i] = {**r, "what": checks[i].what, "python": python, "versions": out["versions"]}
    return [r for r in results if r is not None]
