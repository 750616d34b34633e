"""`python -m loom_router --config ROUTER.json --port P --admin-port A --admin-token T`."""

import sys

from loom_router.shell.main import main

sys.exit(main())
