"""The MoE route (csrc/include/kog/moe_route.cuh, one warp per token) against kog_backend.reference.moe_step.route
and, where the MoE bundle is staged, vLLM's own topk_softmax, on an sm_90 GPU. Fresh random router logits per case,
outputs poisoned before each launch.

* Experts: the same ids in the same order as the reference, except where the reference's k-th and (k+1)-th
  probabilities differ by at most 4 fp32 ulps (a near tie that the softmax's summation order may flip: such rows are
  counted and must stay rare). Equal probabilities (from equal bf16 logits, a few percent of the rows) are exact ties
  and go to the lower expert index in both: they are compared.
* Weights: within a relative 4e-6 of the reference's (fp32 softmax and renormalisation; the sums run in another
  order), and summing to 1 within 1e-6 when norm_topk_prob.
* NaN logits still give k distinct experts in range; the reference's activation and slot sum equal vLLM's
  silu_and_mul and moe_sum ops bit for bit.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from kernel_gpu import require_sm90_extension, require_test_extension  # noqa: E402

from kog_backend import ops  # noqa: E402
from kog_backend.reference import moe_step  # noqa: E402

pytestmark = pytest.mark.gpu

require_sm90_extension()
require_test_extension()  # moe_route_test: csrc/testing/moe_route_test.cu

DEV = torch.device("cuda", 0)
ROWS = 512


def _route(logits: torch.Tensor, k: int, norm: bool) -> tuple[torch.Tensor, torch.Tensor]:
    ids = torch.full((logits.shape[0], k), -7, dtype=torch.int32, device=DEV)
    weights = torch.full((logits.shape[0], k), float("nan"), dtype=torch.float32, device=DEV)
    ops.kog_test_ops().moe_route_test(logits, k, norm, ids, weights)
    torch.cuda.synchronize()
    return ids.cpu(), weights.cpu()


def _check(logits: torch.Tensor, k: int, norm: bool) -> int:
    """Compares every row with the reference; returns the rows skipped as near ties."""
    moe = moe_step.MoeShape(num_experts=logits.shape[1], top_k=k, intermediate_size=1, norm_topk_prob=norm)
    ids, weights = _route(logits, k, norm)
    near = 0
    for row in range(logits.shape[0]):
        r = moe_step.route(logits[row].cpu(), moe)
        ordered = torch.sort(r.probs, descending=True, stable=True).values
        gap = (ordered[k - 1] - ordered[k]).abs() if k < len(ordered) else None
        # Equal probabilities come from equal bf16 logits (frequent: 3-7% of the rows here), the same bits in both
        # softmaxes: those ties are compared (lower index first). Only distinct but close ones are skipped.
        if gap is not None and 0 < gap <= 4 * torch.finfo(torch.float32).eps * ordered[k]:
            near += 1
            continue
        assert ids[row].tolist() == r.experts.tolist(), (row, ids[row], r.experts)
        torch.testing.assert_close(weights[row], r.weights, rtol=4e-6, atol=0)
        if norm:
            assert abs(float(weights[row].double().sum()) - 1.0) <= 1e-6
    return near


@pytest.mark.parametrize("experts,k", [(8, 2), (16, 8), (64, 6), (128, 8), (128, 1), (256, 8), (33, 3)])
@pytest.mark.parametrize("norm", [True, False])
def test_route_matches_the_reference(experts, k, norm):
    g = torch.Generator(device=DEV).manual_seed(experts * 100 + k * 10 + norm)
    logits = (torch.randn(ROWS, experts, generator=g, device=DEV) * 2).to(torch.bfloat16)
    near = _check(logits, k, norm)
    assert near <= ROWS // 50, f"{near} near ties of {ROWS} rows"


def test_equal_logits_go_to_the_lower_index():
    logits = torch.zeros(4, 16, device=DEV)
    logits[1, [3, 9, 12]] = 1.0  # three equal maxima: 3, 9, 12 in that order, then 0, 1, ...
    logits[2] = torch.arange(16, device=DEV).flip(0) // 4  # runs of four equal values
    logits[3, 15] = 5.0
    ids, _ = _route(logits.to(torch.bfloat16), 8, True)
    assert ids[0].tolist() == list(range(8))
    assert ids[1].tolist() == [3, 9, 12, 0, 1, 2, 4, 5]
    assert ids[2].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]
    assert ids[3].tolist()[0] == 15 and ids[3].tolist()[1:] == list(range(7))


def test_nan_router_logits_pick_valid_experts():
    """NaN router logits (a diverged model) make every probability NaN: the route still names k distinct experts in
    [0, E), so that no loader reads outside w13 / w2 (the numbers are garbage, as stock's would be)."""
    logits = torch.full((2, 64), float("nan"), device=DEV).to(torch.bfloat16)
    logits[1, :32] = 1.0  # half NaN
    ids, _ = _route(logits, 8, True)
    for row in ids.tolist():
        assert all(0 <= e < 64 for e in row) and len(set(row)) == 8, row


def _vllm_ops():
    """vLLM's custom ops module with its kernels loaded (torch.ops._C from _C_stable_libtorch, torch.ops._moe_C from
    _moe_C_stable_libtorch: the MoE bundle, vLLM 0.26's module names), or a skip."""
    try:
        import vllm._C_stable_libtorch  # noqa: F401
        import vllm._moe_C_stable_libtorch  # noqa: F401
        from vllm import _custom_ops as vllm_ops
    except Exception as e:  # noqa: BLE001 (any import failure means: not staged)
        pytest.skip(f"vLLM's MoE ops are not available here ({type(e).__name__}: {e}); stage the MoE bundle")
    return vllm_ops


def test_reference_matches_vllm_moe_sum_and_silu_and_mul():
    """The MoE reference's activation and slot sum (moe_step.silu_and_mul_op, combine), which the kernel tests hold
    the MoE kernel to, are vLLM's fused-MoE ops bit for bit: torch.ops._C.silu_and_mul (silu rounded to bf16 before
    the product) and moe_sum (fp32 in slot order, one rounding) on fresh random rows, k = 2, 8."""
    _vllm_ops()
    g = torch.Generator(device=DEV).manual_seed(11)
    gate_up = (torch.randn(16, 2 * 768, generator=g, device=DEV) * 3).to(torch.bfloat16)
    act = torch.full((16, 768), float("nan"), dtype=torch.bfloat16, device=DEV)
    torch.ops._C.silu_and_mul(act, gate_up)
    # (the reference on the GPU too: its exp is the same expf as vLLM's kernel, the CPU's may differ in an ulp)
    assert torch.equal(act, moe_step.silu_and_mul_op(gate_up))
    for k in (2, 8):
        y = (torch.randn(16, k, 2048, generator=g, device=DEV) * 4).to(torch.bfloat16)
        out = torch.full((16, 2048), float("nan"), dtype=torch.bfloat16, device=DEV)
        torch.ops._moe_C.moe_sum(y, out, None, None)
        want = torch.stack([moe_step.combine(row) for row in y])
        assert torch.equal(out, want), f"k {k}: {int((out != want).sum())} elements differ"


def test_matches_vllm_topk_softmax():
    """vLLM's fused-MoE routing kernel (`_moe_C`, the MoE bundle) on the same logits: the same experts outside near
    ties, weights within the same bound."""
    vllm_ops = _vllm_ops()
    g = torch.Generator(device=DEV).manual_seed(7)
    logits = (torch.randn(ROWS, 128, generator=g, device=DEV) * 2).to(torch.bfloat16)
    for norm in (True, False):
        w = torch.empty(ROWS, 8, dtype=torch.float32, device=DEV)
        i = torch.empty(ROWS, 8, dtype=torch.int32, device=DEV)
        tei = torch.empty(ROWS, 8, dtype=torch.int32, device=DEV)
        vllm_ops.topk_softmax(w, i, tei, logits, norm)
        ids, weights = _route(logits, 8, norm)
        same = (ids == i.cpu()).all(dim=1)
        assert int(same.sum()) >= ROWS - ROWS // 50, f"{int((~same).sum())} rows differ from vLLM's"
        torch.testing.assert_close(weights[same], w.cpu()[same], rtol=4e-6, atol=0)
