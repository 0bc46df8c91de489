"""``vitmix.runs.checked_step``: the optimizer step every task's loop makes."""
import pytest
import torch
from torch import nn

from vitmix.runs import checked_step


def _model_and_optimizer():
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    return model, torch.optim.SGD(model.parameters(), lr=1.0)


def test_a_step_applies_the_clipped_gradient():
    model, optimizer = _model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    loss = 100 * model(torch.ones(3, 4)).sum()          # gradient norm far above the clip
    checked_step(loss, model, optimizer, clip_grad=0.5, step=0)
    moved = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
    assert moved.norm().item() == pytest.approx(0.5, rel=1e-5)   # SGD lr 1: the step is the clipped gradient


def test_a_non_finite_loss_names_the_step_and_changes_nothing():
    model, optimizer = _model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    loss = model(torch.full((1, 4), float("nan"))).sum()
    with pytest.raises(FloatingPointError, match="loss became nan at step 8; lower --lr or set --clip-grad"):
        checked_step(loss, model, optimizer, clip_grad=None, step=7, hint="lower --lr or set --clip-grad")
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
