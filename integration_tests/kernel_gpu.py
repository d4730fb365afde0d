"""Module-level guard of the kernel-level GPU tests (the extension's ops called directly, no vLLM engine)."""

from __future__ import annotations

import pytest


def require_sm90_extension() -> None:
    """Skips the calling test module unless an sm_90 GPU is present and kog_backend._C loads."""
    import torch

    from kog_backend import ops

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU", allow_module_level=True)
    if ops.load_reason() is not None:
        pytest.skip(f"extension: {ops.load_reason()}", allow_module_level=True)


def require_test_extension() -> None:
    """Skips the calling test module unless the test-only extension kog_backend._C_test (torch.ops.kog_test) loads."""
    from kog_backend import ops

    reason = ops.kog_test_load_reason()
    if reason is not None:
        pytest.skip(f"test extension: {reason}", allow_module_level=True)


def burst_equals_steps(mk, caches, bt, pos, first_token, n, errors, block_size, on_step=None, model_table=None):
    """n K = 1 launches from position `pos` (each fed the previous token; on_step(t, p, slot, token), if given, runs
    after launch t to check it), then one K = n launch from the same caches: the same tokens, and the same caches bit
    for bit, else a line in `errors`. Returns the tokens of the K = 1 launches. model_table: a variant_table for
    every launch (default: the model's table)."""
    import torch

    dev = bt.device
    init = [c.clone() for c in caches]
    token, toks = first_token, []
    for t in range(n):
        p = pos + t
        sl = int(bt[p // block_size]) * block_size + p % block_size
        tok = mk.step(torch.tensor([token], device=dev), torch.tensor([p], device=dev), bt,
                      torch.tensor([sl], device=dev), model_table=model_table)
        if on_step is not None:
            on_step(t, p, sl, token)
        token = int(tok.item())
        toks.append(token)
    if mk.diagnostics() is not None:
        errors.append(f"timeout: {mk.diagnostics()}")
        mk.reset_counters()
    after = [c.clone() for c in caches]
    for c, c0 in zip(caches, init):
        c.copy_(c0)
    slot = int(bt[pos // block_size]) * block_size + pos % block_size
    tokens, count = mk.generate(torch.tensor([first_token], device=dev), torch.tensor([pos], device=dev), bt,
                                torch.tensor([slot], device=dev), n, model_table=model_table)
    if int(count.item()) != n or tokens.tolist() != toks:
        errors.append(f"K={n} gave {tokens.tolist()} (count {int(count.item())}), K=1 steps {toks}")
    for i, (c, a) in enumerate(zip(caches, after)):
        if not torch.equal(c.view(torch.int16), a.view(torch.int16)):
            errors.append(f"layer {i}: K={n} cache differs from {n} K=1 steps")
    return toks


def logits_follow_reference(w, mk, bt, ref_caches, errors):
    """An on_step for burst_equals_steps: each K = 1 launch's logits within 2e-2 relative norm of reference_step's,
    run on ref_caches (a copy of the caches, which it advances) with the same token."""
    import math

    from kog_backend.monokernel import reference

    def check(t, p, sl, token):
        r = reference.reference_step(w, ref_caches, token, p, sl, bt, mk.attention_splits(p + 1))
        rel = ((mk.logits_scratch.float() - r["logits"].float()).norm() / r["logits"].float().norm()).item()
        if not math.isfinite(rel) or rel > 2e-2:
            errors.append(f"step {t}: logits rel err {rel:.2e}")

    return check


def close_to(errors, name, got, exp, rtol=1e-2, atol_rel=1e-2, norm_rtol=5e-3, ulps=0):
    """got within rtol |exp| (or `ulps` bf16 ulps of exp, whichever is larger) + atol_rel x the RMS of exp per
    element, and within norm_rtol in norm; a line in `errors` otherwise."""
    import torch

    got, exp = got.float(), exp.float()
    if not torch.isfinite(got).all():
        errors.append(f"{name}: {int((~torch.isfinite(got)).sum())} non-finite of {got.numel()}")
        return
    scale = exp.pow(2).mean().sqrt().item() + 1e-30
    err = (got - exp).abs()
    rel_bound = rtol * exp.abs()
    if ulps:  # a bf16 ulp of x: 2^(floor(log2 |x|) - 7)
        rel_bound = torch.maximum(rel_bound, ulps * torch.exp2(torch.floor(torch.log2(exp.abs().clamp_min(1e-30))) - 7))
    bad = err > rel_bound + atol_rel * scale
    rel = ((got - exp).norm() / (exp.norm() + 1e-30)).item()
    if bad.any() or rel > norm_rtol:
        first = bad.nonzero()[0].tolist() if bad.any() else None
        errors.append(
            f"{name}: {int(bad.sum())}/{bad.numel()} off, max err {err.max().item():.3g}, rel {rel:.2e}, "
            f"scale {scale:.3g}, first bad {first} got {got.flatten()[0].item() if first is None else got[tuple(first)].item():.4g}"
            f" exp {exp.flatten()[0].item() if first is None else exp[tuple(first)].item():.4g}"
        )


def context_in_caches(w, caches, ctx, seed, num_blocks, width, block_size, extra=0):
    """A shuffled block table (`width` entries) whose blocks cover ctx + extra positions, the context [0, ctx - 1)
    filled, NaN everywhere else in the caches; returns (pos, slot, block_table) of the step at position ctx - 1."""
    import math

    from kog_backend.monokernel import synthetic

    pos = ctx - 1
    needed = (ctx + extra + block_size - 1) // block_size
    bt = synthetic.shuffled_block_table(num_blocks, needed, width, caches[0].device, seed=seed)
    for c in caches:
        c.fill_(math.nan)
    synthetic.fill_context(caches, bt, pos, w.shape.head_dim, seed=seed)
    slot = int(bt[pos // block_size]) * block_size + pos % block_size
    return pos, slot, bt
