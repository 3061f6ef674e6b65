"""collectors/evaluation/deployed.py: what evaluate and wall_check load before they decode."""

from __future__ import annotations

import pytest

from collectors.evaluation.deployed import check_registered
from config.params import load_params


def test_an_unregistered_pair_is_one_error_naming_the_field_and_the_pair():
    params = load_params()
    registered = sorted(params.pairs)[:2]
    check_registered(params, registered, "evaluate.pairs")  # registered pairs pass
    want = r"^evaluate\.pairs: unknown pair\(s\) \[.nope.\]; the registry has "
    with pytest.raises(ValueError, match=want):
        check_registered(params, [*registered, "nope"], "evaluate.pairs")
