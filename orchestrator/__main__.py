"""Entry point: ``python -m orchestrator [+experiment=NAME] [overrides] [-m]`` (Hydra)."""

from __future__ import annotations

import signal
import sys
from typing import Any

import hydra

from orchestrator.config.errors import OrchestratorError
from orchestrator.config.logs import mark
from orchestrator.config.resolvers import register

register()


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: Any) -> str:
    from orchestrator.scheduling.hydra_launch import run_single

    return run_single(cfg)


MULTIRUN_FLAGS = ("-m", "--multirun")


def flags_last(argv: list[str]) -> list[str]:
    """``-m`` / ``--multirun`` moved after the overrides. Hydra's argparse takes overrides as
    one positional list, so ``+experiment=x -m engine.block_size=32`` (overrides on both sides
    of ``-m``) failed with "unrecognized arguments"; the flag takes no value, so its place
    does not matter."""
    multirun = [a for a in argv if a in MULTIRUN_FLAGS]
    return [a for a in argv if a not in MULTIRUN_FLAGS] + multirun[:1]


def honor_ctrl_c() -> None:
    """Ctrl-C raises KeyboardInterrupt from the start, not only once a handler of the sweep is in
    place: a driver started from a background job of a non-interactive shell (``nohup ... &``, a
    wrapper script) inherits SIGINT *ignored*, and a SIGINT before its trials began was lost."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cli() -> None:
    mark("imports done")
    honor_ctrl_c()
    sys.argv[1:] = flags_last(sys.argv[1:])
    from orchestrator.scheduling import outcome  # the exit statuses, documented there

    try:
        main()
    except SystemExit as exc:
        if exc.code == 1 and not outcome.composed():  # Hydra refused the command line (its message printed)
            sys.exit(outcome.BAD_INPUT)
        raise
    except OrchestratorError as exc:  # config mistakes: a clear message, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(outcome.BAD_INPUT)
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: trials and servers are already stopped
        print("interrupted", file=sys.stderr)
        sys.exit(outcome.INTERRUPTED)
    status, why = outcome.exit_status()
    if status:
        print(f"exit status {status}: {why}", file=sys.stderr)
        sys.exit(status)


if __name__ == "__main__":
    cli()
