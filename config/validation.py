"""What params values must be, as pydantic types, and how a failed check is reported; strict YAML.

A params section is a :class:`Section`: a frozen pydantic model that refuses unknown keys and
coerces nothing. Its fields state their rules in their types: pydantic's ``PositiveInt`` and
``NonNegativeInt``, ``Field(ge=...)``, ``Literal`` choices, and the types below for what recurs
(finite non-negative reals, a sha256, a schedule's bits, an output folder that stays inside the
project: see :func:`outside_problem`). Every number declares its range and every output folder is an
:data:`OutputPath` (tests/test_params_validation.py walks the sections to hold that).

:func:`model_problems` turns pydantic's errors into one :class:`ParamsError` line per bad key, named
by its dotted path. :func:`load_yaml` reads a params file with PyYAML's safe loader, refusing
duplicate keys (PyYAML keeps the last one silently) with their line numbers: no library says that.

This module knows nothing of the sections themselves (config/params.py declares them) and imports
nothing of the project.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

ROOT = Path(__file__).resolve().parent.parent
SHA256 = r"[0-9a-f]{64}"  # as hashlib's hexdigest() writes it (consumers compare it verbatim)
BITS = r"[01]+"  # a fixed schedule: one bit per drafting step


class ParamsError(ValueError):
    """params.yaml (or a profile) does not match the declared sections.

    ``problems`` holds one line per bad key (``params.tree.depth: Input should be greater than 0,
    got -3``); the message lists them all, so one run names every mistake.
    """

    def __init__(self, *problems: str) -> None:
        super().__init__(*problems)
        self.problems: tuple[str, ...] = problems

    def __str__(self) -> str:
        if len(self.problems) == 1:
            return self.problems[0]
        lines = "\n".join(f"  {p}" for p in self.problems)
        return f"{len(self.problems)} invalid params:\n{lines}"


class Section(BaseModel):
    """A params section: frozen, unknown keys refused, nothing coerced (params are checked in
    pydantic's strict JSON mode: ``"5"`` is not 5, ``true`` is not 1, a list is a tuple)."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def model_problems(err: ValidationError, where: str) -> list[str]:
    """One line per problem pydantic found, named by its dotted key (``params.tree.depth: Input
    should be greater than 0, got -3``)."""
    out = []
    for e in err.errors(include_url=False):
        key = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        why = str(e["ctx"]["error"]) if e["type"] == "value_error" else e["msg"]
        got = "" if e["type"] == "missing" else f", got {e['input']!r}"
        out.append(f"{key}: {why}{got}")
    return out


def _allowed_roots(root: Path) -> tuple[Path, ...]:
    # Tests and throwaway runs write under the system temp folder; it is scratch space by design.
    tmp = tempfile.gettempdir()
    return tuple(dict.fromkeys((root, Path(os.path.normpath(tmp)), Path(tmp).resolve())))


def outside_problem(value: str, root: Path) -> str | None:
    """Why output path ``value`` (relative to ``root``) is refused, or None.

    A relative path must land inside the project; an absolute one inside the project or the temp
    folder. The check is lexical (``..`` collapsed, symlinks not followed): a symlink the user
    placed inside the project (artifacts -> a bigger disk) is their choice, a ``../../..`` in a
    params file is not, even where the project itself sits in the temp folder. The project folder
    (or the temp folder) itself is refused too: stages replace their output folder as a whole.
    """
    target = Path(os.path.normpath(root / value))
    if not Path(value).is_absolute():
        project = Path(os.path.normpath(root))
        if target != project and target.is_relative_to(project):
            return None
        return f"must stay inside the project {root} (a relative path may not leave it), resolves to {target}"
    roots = _allowed_roots(root)
    if any(target != r and target.is_relative_to(r) for r in roots):
        return None
    return f"must stay inside the project {root} (or the temp folder {roots[1]}), resolves to {target}"


def _inside_project(value: str) -> str:
    if why := outside_problem(value, ROOT):
        raise ValueError(why)
    return value


INSIDE_PROJECT = AfterValidator(_inside_project)
# A folder or file a stage writes: not empty, inside the project (or the temp folder, if absolute).
OutputPath = Annotated[str, Field(min_length=1), INSIDE_PROJECT]
Real = Annotated[float, Field(ge=0, allow_inf_nan=False)]  # a finite number >= 0
PositiveReal = Annotated[float, Field(gt=0, allow_inf_nan=False)]
Sha256 = Annotated[str, Field(pattern=f"^{SHA256}$")]
Bits = Annotated[str, Field(pattern=f"^{BITS}$")]
Names = Annotated[tuple[str, ...], Field(min_length=1)]  # e.g. pairs or datasets: at least one


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, noting every mapping key that appears twice in one mapping."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self.duplicates: list[str] = []

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            try:
                seen = first.get(key)
            except TypeError:  # an unhashable key: the base constructor reports it
                continue
            if seen is None:
                first[key] = line
            else:
                self.duplicates.append(f"line {line}: duplicate key {key!r} (first at line {seen})")
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path) -> Any:
    """The YAML document in ``path``; duplicate keys and YAML syntax errors raise ParamsError."""
    loader = _UniqueKeyLoader(path.read_text(encoding="utf-8"))
    try:
        data = loader.get_single_data()
    except yaml.YAMLError as err:
        raise ParamsError(f"{path}: not valid YAML: {err}") from None
    finally:
        loader.dispose()
    if loader.duplicates:
        raise ParamsError(*(f"{path}: {d}" for d in loader.duplicates))
    return data
