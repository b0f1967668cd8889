"""``python -m bench.delta``: see bench/delta/run.py."""

import sys

from bench.delta.run import main

sys.exit(main())
