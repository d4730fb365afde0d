"""The FP8 weight-only linear reference (kog_backend.reference.fp8_linear) against a float64 computation written
out by index, for the three scale layouts, on shapes whose last row and column of 128 x 128 blocks are partial.

Bound: the float64 result is exact to ~2^-53; the reference rounds each W_fp8 * s product (2^-24 relative) and sums
K products in fp32, so |y_ref - y_64| <= (K + 2) 2^-24 sum_k |x_k W_nk| (the standard recursive-summation bound)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kog_backend.path.quant_format import Fp8Format  # noqa: E402
from kog_backend.reference import fp8_linear  # noqa: E402
from kog_backend.tools.fixtures.fp8_checkpoints import quantise  # noqa: E402

LAYOUTS = ("tensor", "channel", "block")
SHAPES = [(1, 200, 300), (3, 256, 128), (2, 130, 520)]  # (tokens, N, K)


def _case(layout, m, n, k, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 0.02).to(torch.bfloat16)
    w[:, :7] *= 40  # uneven magnitudes, so that the groups' scales differ
    q, s = quantise(w, Fp8Format("fp8" if layout != "channel" else "compressed-tensors", layout))
    x = torch.randn(m, k, generator=g).to(torch.bfloat16)
    return x, q, s


def _float64(x, q, s, layout):
    """y[t, n] = sum_k x[t, k] * q[n, k] * scale(n, k), every factor in float64, the scale picked by index."""
    n, k = q.shape
    s64 = s.double()
    rows, cols = torch.meshgrid(torch.arange(n), torch.arange(k), indexing="ij")  # [n, k] element indices
    if layout == "tensor":
        scale = s64.reshape(()).expand(n, k)
    elif layout == "channel":
        scale = s64[rows, 0]
    else:
        scale = s64[rows // 128, cols // 128]
    w = q.double() * scale
    return x.double() @ w.t(), x.double().abs() @ w.abs().t()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_reference_is_the_float64_product(layout, m, n, k):
    x, q, s = _case(layout, m, n, k)
    y64, mag = _float64(x, q, s, layout)
    got = fp8_linear.linear_fp32(x, q, s, layout)
    assert got.dtype == torch.float32 and got.shape == (m, n)
    bound = (k + 2) * 2**-24 * mag
    assert ((got.double() - y64).abs() <= bound).all()
    out = fp8_linear.linear(x, q, s, layout)
    assert out.dtype == torch.bfloat16 and torch.equal(out, got.to(torch.bfloat16))  # one rounding, to bf16


@pytest.mark.parametrize("layout", ["channel", "block"])
def test_one_wrong_scale_is_outside_the_bound(layout):
    """The comparison can fail: a single scale 1% off moves its outputs far beyond the fp32 bound."""
    m, n, k = SHAPES[0]
    x, q, s = _case(layout, m, n, k)
    y64, mag = _float64(x, q, s, layout)
    wrong = s.clone()
    wrong.view(-1)[-1] *= 1.01
    got = fp8_linear.linear_fp32(x, q, wrong, layout).double()
    assert not ((got - y64).abs() <= (k + 2) * 2**-24 * mag).all()


@pytest.mark.parametrize("layout,scale_shape", [("tensor", (2,)), ("channel", (200,)), ("channel", (1, 200)),
                                                ("block", (3, 2)), ("block", (2, 2)), ("tensor", (1, 1, 1, 2))])
def test_mis_shaped_scales_are_refused(layout, scale_shape):
    q = torch.zeros(200, 300, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError):
        fp8_linear.dequantise(q, torch.ones(scale_shape), layout)


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError):
        fp8_linear.dequantise(torch.zeros(4, 4, dtype=torch.float8_e4m3fn), torch.ones(()), "row")


@pytest.mark.parametrize("layout", LAYOUTS)
def test_spread_scales_differ_and_keep_the_rounding_bound(layout):
    """The checkpoint writer's spread (each scale times 2^U[0, 1), fp8_checkpoints): on normal weights whose groups
    share an amax, the scales come out different (so a scale read for the wrong row, block or shard shows), and the
    quantisation stays within e4m3's rounding: |W_fp8 s - W| <= 2^-4 |W| + 2^-10 s per element."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(384, 512, generator=g) * 0.02).to(torch.bfloat16)
    fmt = Fp8Format("fp8" if layout != "channel" else "compressed-tensors", layout)
    plain = quantise(w, fmt)[1].float()
    shards = [quantise(w, fmt, spread=torch.Generator().manual_seed(i))[1].float() for i in (1, 2)]
    q, s = quantise(w, fmt, spread=torch.Generator().manual_seed(5))
    assert not torch.equal(shards[0], shards[1])  # two shards of one fused module: different scales
    ratio = s.float() / plain
    assert float(ratio.min()) >= 1.0 - 2**-7 and float(ratio.max()) < 2.0 + 2**-7  # bf16 channel scales round
    if layout != "tensor":
        assert s.float().unique().numel() > s.numel() // 4  # (a bf16 channel scale has 128 values per octave)
    per_elem = fp8_linear.dequantise(torch.ones(w.shape).to(torch.float8_e4m3fn), s.float(), layout)
    err = (fp8_linear.dequantise(q, s.float(), layout) - w.float()).abs()
    assert bool((err <= 2**-4 * w.float().abs() + 2**-10 * per_elem).all())
