"""`python -m detection.toolchain`: the `vision-toolchain` CLI."""

from detection.toolchain.cli import main

raise SystemExit(main())
