"""Framework vs a plain Hogwild loop: `python scripts/bench.py --quick` (see hogwild/bench/)."""

import sys

from hogwild.bench import main

if __name__ == "__main__":
    sys.exit(main())
