"""`python -m vaswani_mt.cli ...`: the same as the `vaswani-mt` command."""

import sys

from . import main

sys.exit(main())
