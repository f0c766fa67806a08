"""The cloud service's configuration reference, `docs/reference/cloud-service.md`, from its models.

    python -m cloud_service.config_reference          # rewrite the page
    python -m cloud_service.config_reference --check  # exit 1 when the page is stale

The rendering is `configkit.reference`'s; this module only names the root model and the page.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cloud_service.config import CloudServiceConfig
from configkit.reference import ReferencePage, main

PAGE = ReferencePage(
    model=CloudServiceConfig,
    path=Path("docs/reference/cloud-service.md"),
    title="Cloud service configuration reference",
    intro=(
        "Every key of the cloud service's YAML file (`cloud-service serve --config FILE`), as "
        "the config models validate it: unknown keys are errors, and `cloud-service "
        "validate-config FILE` reports each error with its YAML line. How the parts work is in "
        "[The cloud service](../cloud-service.md); measured figures are in "
        "[Benchmarks](../benchmarks.md)."
    ),
    command="python -m cloud_service.config_reference",
)

if __name__ == "__main__":
    sys.exit(main([PAGE]))
