"""`python -m cloud_service` runs the `cloud-service` command line."""

import sys

from cloud_service.cli import main

sys.exit(main())
