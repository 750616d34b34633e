"""`python -m loom_operator.cli`: the same as the `loom` command."""

import sys

from loom_operator.cli import main

sys.exit(main())
