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


def burst_equals_steps(mk, caches, bt, pos, first_token, n, errors, block_size, on_step=None):
    """n K = 1 launches from position `pos` (each fed the previous token; on_step(t, p, slot, token), if given, runs
    after launch t to check it), then one K = n launch from the same caches: the same tokens, and the same caches bit
    for bit, else a line in `errors`. Returns the tokens of the K = 1 launches."""
    import torch

    dev = bt.device
    init = [c.clone() for c in caches]
    token, toks = first_token, []
    for t in range(n):
        p = pos + t
        sl = int(bt[p // block_size]) * block_size + p % block_size
        tok = mk.step(torch.tensor([token], device=dev), torch.tensor([p], device=dev), bt,
                      torch.tensor([sl], device=dev))
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
                                torch.tensor([slot], device=dev), n)
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
