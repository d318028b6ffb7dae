"""`python -m fraudrules.cli`: the `fraudrules` command."""

import sys

from fraudrules.cli import main

sys.exit(main())
