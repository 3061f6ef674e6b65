"""The value system has exactly the paper's 45,572 parameters; inputs and suffix encoding; NMAE."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from decoder.deploy.planning import all_suffixes, encode_suffix, suffix_feature_names
from features.selection import nmae
from models.mlp import count_parameters
from models.value import PAPER_VALUE_PARAMS, ValueSystem, value_param_count


def test_value_system_has_45572_parameters():
    model = ValueSystem(23, (128, 64))
    assert count_parameters(model) == PAPER_VALUE_PARAMS == 45_572
    assert model(torch.zeros(3, 23)).shape == (3, 4)


@pytest.mark.parametrize(("in_dim", "hidden"), [(23, (128, 64)), (4, (3,)), (7, (2, 5))])
def test_parameter_formula_matches_the_module(in_dim, hidden):
    assert value_param_count(in_dim, hidden) == count_parameters(ValueSystem(in_dim, hidden))


def test_heads_are_separate_networks():
    """Changing one head's weights moves only that head's output column."""
    torch.manual_seed(0)
    model = ValueSystem(6, (8,))
    x = torch.randn(5, 6)
    before = model(x).detach()
    with torch.no_grad():
        model.heads["logt_invoke"][-1].bias += 1.0
    delta = model(x).detach() - before
    assert torch.allclose(delta[:, 1], torch.ones(5))
    assert torch.equal(delta[:, [0, 2, 3]], torch.zeros(5, 3))


def test_suffix_encoding():
    assert len(suffix_feature_names(5)) == 6
    assert encode_suffix("", 5).tolist() == [0, 0, 0, 0, 0, 0]
    assert encode_suffix("101", 5).tolist() == [1, 0, 1, 0, 2 / 5, 3 / 5]
    assert encode_suffix("0", 5).tolist() != encode_suffix("", 5).tolist()  # the length term tells them apart
    assert all_suffixes(2) == ("00", "10", "01", "11")
    with pytest.raises(ValueError):
        encode_suffix("10101", 5)


def test_nmae_normalizer_is_the_constant_predictor():
    y = np.array([1.0, 2.0, 3.0, 6.0])
    assert nmae(y, np.full(4, y.mean())) == pytest.approx(1.0)
    assert nmae(y, y) == 0.0
    assert nmae(y, y + 1) == pytest.approx(2 / 3)  # MAE 1 over mean |y - 3| = (2 + 1 + 0 + 3) / 4
    assert nmae(10 * y, 10 * y + 10) == pytest.approx(2 / 3)  # scale-free
    assert nmae(np.ones(3), np.zeros(3)) == np.inf
