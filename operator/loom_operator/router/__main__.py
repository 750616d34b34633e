"""`python -m loom_operator.router --config ROUTER.json --port P --admin-port A --admin-token T`."""

import sys

from loom_operator.router.main import main

sys.exit(main())
