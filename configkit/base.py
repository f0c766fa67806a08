"""The base of every config model: unknown keys are errors, values are validated on assignment."""

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Pydantic base for config: `extra="forbid"`, frozen, every field documented and bounded."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        use_attribute_docstrings=True,
    )
