"""The README's sweep commands are the ones that work: each runs here in dry-run form (placeholders
filled in), so a recipe the docs show cannot drift from the code."""

from __future__ import annotations

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from tests.conftest import ROOT


def readme_commands() -> list[list[str]]:
    """Every ``python -m orchestrator ...`` command of the README's code blocks, continuation
    lines joined and comments dropped, as argv lists (the report and submission modules have
    tests of their own)."""
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```(?:bash|sh)?\n(.*?)```", text, flags=re.S)
    out = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.split("  #")[0].strip()
            if not line.startswith("python -m orchestrator ") and line != "python -m orchestrator":
                continue
            if "..." in line:
                continue
            out.append(line)
    import shlex

    return [shlex.split(c)[3:] for c in dict.fromkeys(out)]  # each once


def test_every_readme_sweep_command_plans(tiny_model_dir, tmp_path):
    commands = readme_commands()
    assert len(commands) >= 10, commands
    fill = {"NAME": "chunked_prefill", "/path/to/tokenizer": str(tiny_model_dir)}

    def plan(i_args: tuple[int, list[str]]) -> tuple[list[str], str] | None:
        i, args = i_args
        args = [next((a.replace(k, v) for k, v in fill.items() if k in a), a) for a in args]
        args = [a for a in args if not a.startswith("dry_run=")]
        multirun = ["-m"] if "-m" in args else []
        args = [a for a in args if a != "-m"]
        sweep_dir = f"hydra.sweep.dir={tmp_path}/m{i}"
        cmd = [sys.executable, "-m", "orchestrator", *args, "dry_run=json", sweep_dir, *multirun]
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=180)
        return None if p.returncode == 0 else (args, (p.stderr or p.stdout)[-600:])

    # two at a time: each is a CLI start that plans and starts nothing (no timing in it)
    with ThreadPoolExecutor(max_workers=2) as pool:
        failed = [f for f in pool.map(plan, enumerate(commands)) if f]
    assert not failed, failed
