"""The updater's state on disk (`state_dir/state.json`): what runs, what ran before, what is on
trial, what was rejected. Written atomically so a power cut at any point leaves either the old
file or the new one, never a torn one.

The state is read at boot, before the detector loads: the box runs `current` (the last model
that was kept, or the config's own model when None) after its file's sha256 is checked again,
else `previous`, else the config's own model. A model on `trial` (swapped in, not yet kept) never
runs at boot: a power cut mid-swap or mid-trial boots on the model that ran before it, and the
updater tries the trial again only `max_boot_attempts` times before rejecting it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "STATE_FILE",
    "FleetState",
    "ModelRecord",
    "Trial",
    "file_sha256",
    "load_state",
    "save_state",
]

logger = logging.getLogger(__name__)

STATE_FILE = "state.json"
_MAX_STATE_BYTES = 1 << 20
_HASH_CHUNK = 1 << 20


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelRecord(_Record):
    """A fleet model on this box: its identity and the verified artifact file."""

    name: str = Field(min_length=1, max_length=256)
    version: str = Field(min_length=1, max_length=256)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    path: Path
    runtime: str = Field(min_length=1, max_length=32)

    def document(self) -> dict[str, str]:
        """As the status document and events name it."""
        return {"name": self.name, "version": self.version, "sha256": self.sha256}

    def label(self) -> str:
        """`name:version`, as the status shows it per camera."""
        return f"{self.name}:{self.version}"

    def __str__(self) -> str:
        return f"{self.name}:{self.version}@{self.sha256[:12]}"


class Trial(_Record):
    """A model swapped in (or about to be) and not yet kept: the evidence decides."""

    model: ModelRecord
    rollout_id: str = Field(default="", max_length=256)
    started_at: str = Field(default="", max_length=64)


class FleetState(_Record):
    """See the module docstring. `current` / `previous` None mean the config's own model."""

    version: int = 1
    current: ModelRecord | None = None
    previous: ModelRecord | None = None
    trial: Trial | None = None
    rejected: tuple[str, ...] = ()
    attempts: dict[str, int] = Field(default_factory=dict)  # trials started, by sha256
    pending: ModelRecord | None = None  # wanted, being downloaded (its path not there yet)

    def keep(self) -> set[str]:
        """The digests whose files must stay on disk."""
        records = (self.current, self.previous, self.pending)
        kept = {r.sha256 for r in records if r is not None}
        if self.trial is not None:
            kept.add(self.trial.model.sha256)
        return kept


def load_state(state_dir: Path) -> FleetState:
    """The state in `state_dir`; an empty one when there is none. A file that does not parse
    (a failing disk: writes are atomic) is set aside as `state.json.corrupt`, logged, and an
    empty state is returned, so the box boots on the config's own model."""
    path = state_dir / STATE_FILE
    try:
        with path.open("rb") as handle:
            raw = handle.read(_MAX_STATE_BYTES + 1)
    except FileNotFoundError:
        return FleetState()
    try:
        if len(raw) > _MAX_STATE_BYTES:
            raise ValueError(f"larger than {_MAX_STATE_BYTES} bytes")
        return FleetState.model_validate(json.loads(raw))
    except (ValueError, ValidationError) as exc:
        aside = path.with_name(STATE_FILE + ".corrupt")
        os.replace(path, aside)
        logger.error(
            "fleet state %s is unreadable (%s); set aside as %s, starting from the config's model",
            path,
            str(exc).splitlines()[0],
            aside.name,
        )
        return FleetState()


def save_state(state_dir: Path, state: FleetState) -> None:
    """Write `state` atomically: a temp file in the same folder, fsync, rename, fsync the folder."""
    state_dir.mkdir(parents=True, exist_ok=True)
    data = state.model_dump_json(indent=1).encode()
    fd, temp = tempfile.mkstemp(prefix=".state-", suffix=".tmp", dir=state_dir)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, state_dir / STATE_FILE)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    folder = os.open(state_dir, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def file_sha256(path: Path) -> str:
    """The hex sha256 of the file at `path`."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()
