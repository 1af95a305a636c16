"""``python -m orchestrator.sync SWEEP_DIR``: see :mod:`orchestrator.scheduling.sync`."""

import sys

from orchestrator.scheduling.sync import main

if __name__ == "__main__":
    sys.exit(main())
