"""deployment.json's fields, declared as frozen pydantic models, and the one function that checks them.

Contract: :func:`parse_record` validates the bytes of a deployment.json against
:class:`DeploymentRecord` in pydantic's strict JSON mode (no coercion: ``"24"`` is not 24, ``true``
is not 1) and returns the record, or raises one :class:`~decoder.deploy.bundle.DeploymentError`
naming the file and every bad field by its dotted path. Unknown fields are refused at every level;
a field is missing only when the file leaves it out (every one is required, the tree's included).
Two rules no type states are written out: a decision deploys either a fallback with no threshold
or the student at the offset its name says, and the tree is a valid TreeConfig (its own checks).

Imports only the record's own value types (TreeConfig) and the bundle's file layer; the loading
(student, profile, paths) is decoder/deploy/deployment.py's.
"""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model, model_validator

from decoder.core.config import TreeConfig
from decoder.core.policies import AR
from decoder.deploy.bundle import HEX64, PAIR_NAME, DeploymentError

SCHEMA_VERSION = "treegraft-deployment/2"  # /2: the paired margins and the adaptive rule's thresholds
FALLBACKS = ("all-small", "all-mid", AR)  # what a pair deploys when no threshold beats its endpoints


def is_fallback(deploys: str) -> bool:
    """A fixed policy rather than the student: a named fallback or a fixed schedule's bits (the
    budget stage's, where it beat the student on the calibration prompts)."""
    return deploys in FALLBACKS or (bool(deploys) and set(deploys) <= {"0", "1"})


Finite = Annotated[float, Field(allow_inf_nan=False)]
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1)]
Hex64 = Annotated[str, Field(pattern=f"^{HEX64}$")]


def variant_name(offset: float) -> str:
    """The student at its exported threshold is ``student``; shifted by o, ``student:o`` (2 decimals,
    a sign only when negative: the name is part of MLflow metric keys, which may not hold a '+')."""
    return "student" if offset == 0 else f"student:{offset:.2f}"


class _Record(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


Interval = Annotated[list[Positive], Field(min_length=3, max_length=3)]  # [point, low, high]


class Adaptive(_Record):
    """The online adaptive rule's thresholds the pair check chose on the calibration prompts
    (decoder/core/adaptive.py), with each variant's paired speedup over the defaults."""

    margin: NonNegative
    probe: int = Field(ge=1)
    paired: dict[str, Interval]


class Decision(_Record):
    """The pair check's (collectors/evaluation/pair_check.py): what the pair deploys (the student at an
    offset, or a fixed policy: a named fallback or the budget stage's schedule as bits), at which
    threshold, on how many calibration prompts, the pooled speedup over AR of every option it
    priced, the option it prefers, every option's paired speedup over that one with its 95%
    interval, the chosen option's (``margin``), and the adaptive rule's thresholds."""

    deploys: Text
    threshold_offset: Finite | None
    threshold: Finite | None
    prompts: int = Field(ge=0)
    speedup: dict[str, Positive]
    preferred: Text
    paired: dict[str, Interval]
    margin: Interval
    adaptive: Adaptive

    @model_validator(mode="after")
    def _deploys_its_threshold(self) -> Decision:
        offset, threshold = self.threshold_offset, self.threshold
        if is_fallback(self.deploys):
            if offset is not None or threshold is not None:
                raise ValueError(f"a fallback ({self.deploys}) has threshold_offset and threshold null")
        elif offset is None or threshold is None:
            raise ValueError(
                f"{self.deploys!r} is not a fallback: threshold_offset and threshold are numbers"
            )
        elif self.deploys != variant_name(offset):
            raise ValueError(
                f"deploys {self.deploys!r} must be one of {FALLBACKS}, a fixed schedule's bits or "
                f"{variant_name(offset)!r}"
            )
        return self


class _Tree(_Record):
    @model_validator(mode="after")
    def _is_a_tree_config(self) -> _Tree:
        self.config()  # TreeConfig's own checks (positive sizes, verify_ms covering the budget, ...)
        return self

    def config(self) -> TreeConfig:
        return TreeConfig(**dict(self))


# TreeConfig's fields with their types, every one required: the file spells the whole tree out, so a
# field left out is an error, not TreeConfig's default.
TreeRecord = create_model(
    "TreeRecord",
    __base__=_Tree,
    **{f.name: (typing.get_type_hints(TreeConfig)[f.name], ...) for f in dataclasses.fields(TreeConfig)},
)


class Decode(_Record):
    max_new_tokens: int = Field(ge=1)
    temperature: NonNegative
    seed: int = Field(ge=0)


class Costs(_Record):
    """decoder.deploy.runtime_costs.RuntimeCosts as stored."""

    target_ms: Positive
    mid_ms: NonNegative


class Models(_Record):
    """Paths relative to the bundle folder (``mid`` null: a pair without a mid drafter)."""

    target: Text
    mid: Text | None
    dtype: Text
    device: Text
    linear: Text
    template: Text


class Profile(_Record):
    pair: Text
    device: Text
    sha256: Hex64


class Provenance(_Record):
    git_revision: Text
    inputs: dict[str, Hex64]


class DeploymentRecord(_Record):
    schema_version: Literal[SCHEMA_VERSION]
    pair_id: Annotated[str, Field(pattern=f"^{PAIR_NAME}$")]  # usable as a folder name
    decision: Decision
    tree: TreeRecord
    decode: Decode
    runtime: Costs
    models: Models
    profile: Profile
    provenance: Provenance
    student_manifest_sha256: Hex64


def _problem(e: dict[str, typing.Any]) -> str:
    field = ".".join(map(str, e["loc"]))
    if e["type"] == "value_error":  # a validator above: its message says what it got
        return f"field {field!r}: {e['ctx']['error']}"
    got = "" if e["type"] == "missing" else f", got {e['input']!r}"
    return f"field {field!r}: {e['msg']}{got}" if field else f"{e['msg']}{got}"


def parse_record(data: bytes, where: Path) -> DeploymentRecord:
    """The record in deployment.json's bytes ``data``, or one DeploymentError naming ``where`` and every
    bad field."""
    try:
        return DeploymentRecord.model_validate_json(data)
    except ValidationError as err:
        problems = "; ".join(_problem(e) for e in err.errors(include_url=False))
        raise DeploymentError(f"{where}: {problems}") from None
