"""Secrets named in config, resolved from the environment or from systemd credentials.

The YAML only says where a secret comes from (`env: MQTT_PASSWORD` or `credential: mqtt-password`);
the value itself never sits in the file. systemd's `LoadCredential=`/`LoadCredentialEncrypted=`
put credentials as files under `$CREDENTIALS_DIRECTORY`, readable only by the service.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Self

from pydantic import BaseModel, Field, model_validator

from configkit.base import StrictModel

__all__ = ["CREDENTIALS_DIRECTORY_ENV", "SecretError", "SecretRef", "find_secret_refs"]

CREDENTIALS_DIRECTORY_ENV = "CREDENTIALS_DIRECTORY"


class SecretError(Exception):
    """A secret that the config refers to could not be resolved."""


class SecretRef(StrictModel):
    """Where a secret comes from: exactly one of an environment variable or a systemd credential."""

    env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        max_length=128,
        description="Environment variable that holds the secret.",
    )
    credential: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9_@-][A-Za-z0-9_.@-]*$",
        max_length=255,
        description="systemd credential name: the file `$CREDENTIALS_DIRECTORY/<name>`.",
    )

    @model_validator(mode="after")
    def _exactly_one_source(self) -> Self:
        if (self.env is None) == (self.credential is None):
            raise ValueError("set exactly one of `env` or `credential`")
        return self

    def describe(self) -> str:
        """Where the secret comes from, for messages (never the value)."""
        if self.env is not None:
            return f"environment variable {self.env}"
        return f"credential {self.credential!r}"

    def resolve(
        self,
        environ: Mapping[str, str] | None = None,
        credentials_dir: str | Path | None = None,
    ) -> str:
        """Read the secret now.

        `environ` defaults to `os.environ`; `credentials_dir` to `$CREDENTIALS_DIRECTORY` from
        `environ`. A single trailing newline of a credential file is dropped (files written with
        `echo`). Raises `SecretError` naming the source, never the value, when it is unavailable.
        """
        env = os.environ if environ is None else environ
        if self.env is not None:
            value = env.get(self.env)
            if value is None:
                raise SecretError(f"environment variable {self.env} is not set")
            if not value:
                raise SecretError(f"environment variable {self.env} is empty")
            return value
        directory = (
            credentials_dir if credentials_dir is not None else env.get(CREDENTIALS_DIRECTORY_ENV)
        )
        if not directory:
            raise SecretError(
                f"credential {self.credential!r} needs ${CREDENTIALS_DIRECTORY_ENV} "
                "(set by systemd LoadCredential=), which is not set"
            )
        path = Path(directory) / str(self.credential)
        try:
            value = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise SecretError(f"credential {self.credential!r} not found in {directory}") from None
        except (OSError, UnicodeDecodeError) as error:
            raise SecretError(f"credential {self.credential!r} unreadable: {error}") from None
        value = value.removesuffix("\n").removesuffix("\r")
        if not value:
            raise SecretError(f"credential {self.credential!r} is empty")
        return value


def find_secret_refs(
    model: BaseModel, path: tuple[str | int, ...] = ()
) -> Iterator[tuple[tuple[str | int, ...], SecretRef]]:
    """Every `SecretRef` inside a validated config, with its key path (to check them up front)."""
    for name in type(model).model_fields:
        value = getattr(model, name)
        yield from _refs_in(value, (*path, name))


def _refs_in(
    value: object, path: tuple[str | int, ...]
) -> Iterator[tuple[tuple[str | int, ...], SecretRef]]:
    if isinstance(value, SecretRef):
        yield path, value
    elif isinstance(value, BaseModel):
        yield from find_secret_refs(value, path)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            yield from _refs_in(item, (*path, index))
    elif isinstance(value, Mapping):  # e.g. webhook headers whose values may be secrets
        for key, item in value.items():
            yield from _refs_in(item, (*path, str(key)))
