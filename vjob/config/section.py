"""The base of every configuration section, the kernel's and those its owners keep beside
their code (vjob.config.composed explains the composition).

Why pydantic models with `extra="forbid"`: an operator's typo (`[priorty]`, `weigth = 1`) must
be an error naming the key, not a silently ignored setting.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """Base of every section: unknown keys are errors, values are validated on assignment."""

    # No use_attribute_docstrings: it parses every class's source at import (70 ms of each
    # `vjob` command); only `vjob config reference` reads the docstrings (_attribute_docs).
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
