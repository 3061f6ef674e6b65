"""The student has exactly the paper's 3,265 parameters and never sees the future suffix."""

from __future__ import annotations

import torch

from models.mlp import count_parameters
from models.student import PAPER_STUDENT_PARAMS, Student, student_param_count


def test_student_has_3265_parameters():
    model = Student(17, (64, 32))
    assert count_parameters(model) == student_param_count(17, (64, 32)) == PAPER_STUDENT_PARAMS == 3_265
    assert model(torch.zeros(2, 17)).shape == (2, 1)
    sizes = [m.in_features for m in model.net if isinstance(m, torch.nn.Linear)]
    assert sizes == [17, 64, 32]  # 17 = 4 context + 7 history + 6 signals: no suffix input
