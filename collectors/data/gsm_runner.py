"""Runs reasoning-gym's GSM-Symbolic generators in their own interpreter and prints JSON.

Contract: ``python -I -S gsm_runner.py ROOT`` with a JSON request on stdin
(``{"rng_state": random.Random().getstate(), "per_template": n, "difficulty": x}``), where ROOT
holds the extracted ``reasoning_gym/`` files, prints ``{"n_templates", "draws", "items"}``: for each
generator in order, up to ``per_template`` instances, each drawn with
``gen(Random(rng.randrange(2**31)), difficulty)`` and a template's loop ending at its first
failure; ``draws`` counts the ``randrange`` calls so the caller can advance its own generator.
Each item is ``{"question", "answer"}`` (the chain-of-thought answer when there is one).

The caller (collectors/data/embedded_data.py) only reads this file's path; this module imports nothing
of the project and nothing outside the standard library, so the downloaded generators run here,
isolated (``-I``: no environment variables, no user site; ``-S``: no site-packages), never in the
pipeline's own process. Only the generator files are loaded, without reasoning_gym's package init.
"""

from __future__ import annotations

import importlib.util
import json
import random
import sys
import types
from pathlib import Path
from typing import Any

MODULES = (
    "utils",
    "arithmetic.gsm_symbolic.generators_00_49",
    "arithmetic.gsm_symbolic.generators_50_99",
)


def load_generators(root: Path) -> list[Any]:
    pkg = types.ModuleType("reasoning_gym")
    pkg.__path__ = [str(root / "reasoning_gym")]
    sys.modules["reasoning_gym"] = pkg
    gens = []
    for mod in MODULES:
        path = root / "reasoning_gym" / (mod.replace(".", "/") + ".py")
        spec = importlib.util.spec_from_file_location(f"reasoning_gym.{mod}", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        names = sorted(
            (n for n in dir(module) if n.startswith("generate_")), key=lambda n: int(n.split("_")[1])
        )
        gens += [getattr(module, n) for n in names]
    return gens


def run(root: Path, request: dict[str, Any]) -> dict[str, Any]:
    version, internal, gauss = request["rng_state"]
    rng = random.Random()
    rng.setstate((version, tuple(internal), gauss))
    gens = load_generators(root)
    items, draws = [], 0
    for gen in gens:
        for _ in range(request["per_template"]):
            draws += 1
            try:
                it = gen(random.Random(rng.randrange(2**31)), request["difficulty"])
            except Exception:
                break
            items.append(
                {"question": it["question"], "answer": it["metadata"].get("answer_cot", it["answer"])}
            )
    return {"n_templates": len(gens), "draws": draws, "items": items}


if __name__ == "__main__":
    json.dump(run(Path(sys.argv[1]), json.load(sys.stdin)), sys.stdout)
