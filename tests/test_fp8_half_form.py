"""The FP8 kernel's f16 form (fp8.cuh, ModelArgs::fp8_gemv 1) as replayed by reference/fp8_linear.py
half_form_linear_fp32, against the exact (float64) weight-only product, on weights quantised as the checkpoints are
(every layout) and inputs of several magnitudes.

What is bounded and why: the inputs enter exactly (bf16 values with 2^-6 <= |x| <= 4096 are f16 values after the
2^-8 scaling); each 16-element vector is summed in f16 (four products per chain half, each step rounded once to f16's
11 bits), so a vector's sum carries ~2^-11 relative rounding a few times over; the vectors add in fp32. On these
draws the result's relative norm error was 3.7e-4 to 4.3e-4, a quarter of the error of the output's own bf16
rounding (1.5e-3 to 1.8e-3). Bound: 1e-3 of the exact norm, and no element off by more than 1e-2 of the exact
output's RMS. The kernel's GPU test holds the kernel to the exact reference with the stage bounds of
test_monokernel_gpu (5e-3 relative norm per stage)."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from kog_backend.monokernel import layout  # noqa: E402
from kog_backend.path.quant_format import Fp8Format  # noqa: E402
from kog_backend.reference import fp8_linear  # noqa: E402
from kog_backend.tools.fixtures.fp8_checkpoints import quantise  # noqa: E402

LAYOUTS = ("tensor", "channel", "block")
FORMATS = {"tensor": "fp8", "channel": "compressed-tensors", "block": "fp8"}


def _weights(n, k, layout_name, g):
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[:, : k // 64] *= 20  # uneven magnitudes: the scales differ between rows and blocks
    return quantise(w, Fp8Format(FORMATS[layout_name], layout_name))


def _exact(x, q, s, layout_name):
    return (fp8_linear.dequantise(q, s, layout_name).double() @ x.double())


def test_constants_mirror_the_kernel():
    assert fp8_linear.HALF_SHIFT == layout.CONFIG["kFp8HalfShift"]
    assert fp8_linear.HALF_MAX_INPUT == layout.CONFIG["kFp8HalfMaxInput"]
    # (config.cuh's static_assert: no f16 partial of 8 products of |w| <= 448 can overflow)
    assert 8 * 448 * fp8_linear.HALF_MAX_INPUT * 2.0**-fp8_linear.HALF_SHIFT <= 65504


@pytest.mark.parametrize("layout_name", LAYOUTS)
@pytest.mark.parametrize("k,x_scale", [(2048, 1.0), (4096, 0.05), (4096, 30.0), (14336, 1.0)])
def test_half_form_within_bound_of_exact(layout_name, k, x_scale):
    g = torch.Generator().manual_seed(k + int(x_scale * 100) + len(layout_name))
    q, s = _weights(256, k, layout_name, g)
    x = (torch.randn(k, generator=g) * x_scale).to(torch.bfloat16)
    x[:: 97] = (x[:: 97].float() * 20).clamp(-4096, 4096).to(torch.bfloat16)  # a few large inputs
    exact = _exact(x, q, s, layout_name)
    got = fp8_linear.half_form_linear_fp32(x, q, s, layout_name).double()
    rel = ((got - exact).norm() / exact.norm()).item()
    bf16_rel = ((exact.to(torch.bfloat16).double() - exact).norm() / exact.norm()).item()
    rms = exact.pow(2).mean().sqrt().item()
    worst = (got - exact).abs().max().item()
    assert math.isfinite(rel) and rel <= 1e-3, (rel, bf16_rel)
    assert worst <= 1e-2 * rms, (worst, rms)


def test_half_form_is_exact_where_every_sum_is():
    """Small integer weights and inputs keep every f16 partial exact: the replay then equals the exact product,
    which checks the schedule's bookkeeping (pairs, chains, scaling) rather than its rounding."""
    g = torch.Generator().manual_seed(1)
    n, k = 64, 512
    w = torch.randint(-8, 9, (n, k), generator=g).float()
    q = w.to(torch.float8_e4m3fn)
    s = torch.full((n, 1), 0.5)
    x = torch.randint(-16, 17, (k,), generator=g).float().to(torch.bfloat16)
    got = fp8_linear.half_form_linear_fp32(x, q, s, "channel").double()
    assert torch.equal(got, _exact(x, q, s, "channel"))


def test_small_inputs_lose_at_most_the_subnormal_step():
    """Inputs below 2^-6 become f16 subnormals after the scaling: each is off by at most 2^-17 (half of 2^-24 x
    2^8), so the product is off by at most 2^-17 sum |W| plus the f16 sums' rounding."""
    g = torch.Generator().manual_seed(2)
    q, s = _weights(128, 2048, "channel", g)
    x = (torch.rand(2048, generator=g) * 2 ** -7).to(torch.bfloat16)
    exact = _exact(x, q, s, "channel")
    got = fp8_linear.half_form_linear_fp32(x, q, s, "channel").double()
    wsum = fp8_linear.dequantise(q, s, "channel").double().abs().sum(dim=1)
    assert bool(((got - exact).abs() <= 2 ** -17 * wsum + 2e-3 * exact.abs() + 1e-12).all())


@pytest.mark.parametrize("bad", [4128.0, float("nan"), -1e5])
def test_inputs_beyond_the_range_are_refused(bad):
    """4128: the next bf16 value above 4096."""
    q, s = _weights(16, 256, "tensor", torch.Generator().manual_seed(3))
    x = torch.zeros(256, dtype=torch.bfloat16)
    x[5] = bad
    with pytest.raises(ValueError, match="aborts the launch"):
        fp8_linear.half_form_linear_fp32(x, q, s, "tensor")
