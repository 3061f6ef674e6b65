"""Value rules of params, declared on each dataclass field and checked in one place; strict YAML.

A field of a params section carries its rule as ``dataclasses.field`` metadata, written with
:func:`rule` (``depth: int = rule(ge=1)``). :func:`field_problems` checks one parsed value against
its field's rule and returns every reason it fails, so the parser can report all bad keys at once.
A field with no rule still gets the defaults every params value obeys:

- numbers (int and float, never bool) are finite and >= 0;
- a field named ``out_dir`` or ending in ``_dir`` is an output folder and must stay inside the
  project (see :func:`outside_problem`).

:func:`load_yaml` reads a params file with PyYAML's safe loader, refusing duplicate keys (PyYAML
keeps the last one silently) with their line numbers.

This module knows nothing of the sections themselves (config/params.py declares them) and imports
nothing of the project.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

RULE_KEY = "params_rule"  # the dataclasses.field metadata key holding a field's Rule
SHA256 = r"[0-9a-f]{64}"  # as hashlib's hexdigest() writes it (consumers compare it verbatim)
BITS = r"[01]+"  # a fixed schedule: one bit per drafting step


class ParamsError(ValueError):
    """params.yaml (or a profile) does not match the declared sections.

    ``problems`` holds one line per bad key (``params.tree.depth: must be >= 1, got -3``); the
    message lists them all, so one run names every mistake.
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
    """A params section declared with pydantic: frozen, unknown keys refused, no coercion (YAML's
    ``"5"`` is not 5, ``true`` is not 1). Its fields state their own rules (``Field(ge=1)``,
    ``Literal``); the defaults below (finite numbers >= 0, output folders inside the project) do not
    apply to it."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


def model_problems(err: ValidationError, where: str) -> list[str]:
    """One line per problem pydantic found, named by its dotted key (``params.tree.depth: Input
    should be greater than or equal to 1, got -3``)."""
    out = []
    for e in err.errors(include_url=False):
        key = where + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in e["loc"])
        got = "" if e["type"] == "missing" else f", got {e['input']!r}"
        out.append(f"{key}: {e['msg']}{got}")
    return out


@dataclass(frozen=True)
class Rule:
    """What a params value must satisfy beyond its type. On a list field it applies to each item
    (nested lists included); ``nonempty`` applies to the list (or string) itself."""

    ge: float | None = None
    gt: float | None = None
    choices: tuple[str, ...] = ()
    pattern: str = ""  # the whole string must match
    inside: bool = False  # an output path: stays inside the project (if absolute, or the temp folder)
    allow_inf: bool = False
    nonempty: bool = False


NUMBER = Rule(ge=0)
OUTPUT_PATH = Rule(inside=True, nonempty=True)


def rule(default: Any = dataclasses.MISSING, **kwargs: Any) -> Any:
    """A dataclass field (with ``default`` if given) carrying the value rule ``Rule(**kwargs)``."""
    metadata = {RULE_KEY: Rule(**kwargs)}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def rule_of(f: dataclasses.Field[Any]) -> Rule | None:
    """The field's declared rule, else the default for output folders; numbers get NUMBER later."""
    declared = f.metadata.get(RULE_KEY)
    if declared is not None:
        return declared
    return OUTPUT_PATH if f.name == "out_dir" or f.name.endswith("_dir") else None


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


def _scalar_problems(r: Rule, value: Any, root: Path) -> list[str]:
    out: list[str] = []
    if isinstance(value, float) and (math.isnan(value) or (math.isinf(value) and not r.allow_inf)):
        return ["must be a finite number"]
    if isinstance(value, int | float) and not isinstance(value, bool):
        if r.ge is not None and not value >= r.ge:
            out.append(f"must be >= {r.ge:g}")
        if r.gt is not None and not value > r.gt:
            out.append(f"must be > {r.gt:g}")
    if isinstance(value, str):
        if r.nonempty and not value:
            return ["must not be empty"]
        if r.choices and value not in r.choices:
            out.append(f"must be one of {list(r.choices)}")
        if r.pattern and not re.fullmatch(r.pattern, value):
            out.append(f"must match {r.pattern!r}")
        if r.inside and (why := outside_problem(value, root)):
            out.append(why)
    return out


def field_problems(r: Rule | None, value: Any, where: str, root: Path) -> list[str]:
    """Every way ``value`` (already of the field's type) breaks rule ``r``, each naming ``where``."""
    if isinstance(value, tuple):
        problems = [f"{where}: must not be empty"] if r is not None and r.nonempty and not value else []
        for i, item in enumerate(value):
            problems += field_problems(r, item, f"{where}[{i}]", root)
        return problems
    if isinstance(value, int | float) and not isinstance(value, bool):
        r = r or NUMBER
    if r is None:
        return []
    return [f"{where}: {why}, got {value!r}" for why in _scalar_problems(r, value, root)]


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
