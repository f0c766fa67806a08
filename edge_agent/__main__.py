"""`python -m edge_agent` runs the `edge-agent` command line."""

import sys

from edge_agent.cli import main

sys.exit(main())
