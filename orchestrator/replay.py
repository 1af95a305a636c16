"""``python -m orchestrator.replay SWEEP_DIR``: see :mod:`orchestrator.scheduling.replay`."""

import sys

from orchestrator.scheduling.replay import main

if __name__ == "__main__":
    sys.exit(main())
