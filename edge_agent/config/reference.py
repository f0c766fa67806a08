"""The edge agent's configuration reference, `docs/reference/edge-agent.md`, from its models.

    python -m edge_agent.config.reference          # rewrite the page
    python -m edge_agent.config.reference --check  # exit 1 when the page is stale

The rendering is `configkit.reference`'s; this module only names the root model and the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from configkit.reference import ReferencePage, main
from edge_agent.config.root import EdgeAgentConfig

PAGE = ReferencePage(
    model=EdgeAgentConfig,
    path=Path("docs/reference/edge-agent.md"),
    title="Edge agent configuration reference",
    intro=(
        "Every key of the edge agent's YAML file (`edge-agent run --config FILE`), as the config "
        "models validate it: unknown keys are errors, and `edge-agent validate-config FILE` "
        "reports each error with its YAML line. How the sections work together is in "
        "[The edge agent](../edge-agent.md) and [The hybrid loop](../hybrid-loop.md); "
        "measured figures behind the defaults are in [Benchmarks](../benchmarks.md)."
    ),
    command="python -m edge_agent.config.reference",
)

if __name__ == "__main__":
    sys.exit(main([PAGE]))
