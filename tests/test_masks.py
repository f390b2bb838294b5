"""masked_whiten keeps its accuracy when the mean dwarfs the spread (one-pass variance in float64)."""

import pytest
import torch

from mlbook.posttrain.masks import masked_whiten

pytestmark = pytest.mark.unit


def _two_pass(x, mask):
    """Reference: mean and population std of the masked entries, two passes in float64."""
    vals = x.double()[mask.bool()]
    return (x.double() - vals.mean()) / vals.std(unbiased=False) * mask.double()


@pytest.mark.parametrize("ratio", [1e3, 1e4])
def test_whiten_float32_with_large_mean(ratio):
    gen = torch.Generator().manual_seed(0)
    mask = (torch.rand(8, 32, generator=gen) < 0.7).float()
    x = (ratio + torch.randn(8, 32, generator=gen)).float()  # |mean| / std = ratio
    out = masked_whiten(x, mask)
    assert out.dtype == torch.float32
    ref = _two_pass(x, mask)
    err = float((out.double() - ref).abs().max())
    assert err < 1e-3, f"|mean|/std = {ratio:g}: whitened values off by {err:.2e}"
    on = out[mask.bool()].double()
    assert abs(float(on.mean())) < 1e-4 and abs(float(on.std(unbiased=False)) - 1) < 1e-4


def test_whiten_is_zero_off_the_mask_and_keeps_float64():
    x = torch.tensor([[1.0, 2.0, 3.0, 100.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    out = masked_whiten(x, mask)
    assert out.dtype == torch.float64 and out[0, 3] == 0
    assert torch.allclose(
        out[0, :3], torch.tensor([-1.0, 0.0, 1.0], dtype=torch.float64) * 1.5**0.5, atol=1e-7
    )
