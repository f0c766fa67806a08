"""A build cache for exported models: each artefact lives under a key that hashes its inputs."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

EXPORT_CODE = Path(__file__).with_name("export.py")


def toolchain_versions() -> dict[str, str]:
    """Versions that change an export's result: ultralytics, torch and our export code."""
    import torch
    import ultralytics

    return {
        "ultralytics": ultralytics.__version__,
        "torch": torch.__version__,
        "export_code": hashlib.sha256(EXPORT_CODE.read_bytes()).hexdigest()[:16],
    }


def cache_key(kind: str, **inputs: Any) -> str:
    """`<kind>-<hash>` over `inputs` and the toolchain versions."""
    blob = json.dumps({"kind": kind, **inputs, **toolchain_versions()}, sort_keys=True, default=str)
    return f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:16]}"


def cached(cache_root: Path, key: str, build: Callable[[Path], Path]) -> Path:
    """The file `build(dir)` makes, built once into `cache_root/<key>/` (atomic rename)."""
    final = cache_root / key
    meta = final / "meta.json"
    if meta.is_file():
        return final / str(json.loads(meta.read_text())["file"])
    work = cache_root / f"{key}.tmp-{os.getpid()}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    start = time.perf_counter()
    produced = build(work)
    seconds = time.perf_counter() - start
    (work / "meta.json").write_text(
        json.dumps({"file": produced.name, "seconds": round(seconds, 2), **toolchain_versions()})
    )
    logger.info("built %s in %.1f s", key, seconds)
    try:
        work.rename(final)
    except OSError:  # another process finished first: use theirs
        shutil.rmtree(work, ignore_errors=True)
    return final / produced.name
