"""``python -m hafo``."""

import sys

from hafo.cli import main

sys.exit(main())
