"""Teacher forcing across two engines: record every step's logits, optionally overriding the sampled token.

Greedy outputs of kog and stock can only differ where a bf16 near-tie flips the argmax (random-weight models have
many: logits are rounded to bf16, whose spacing near the top logit is a few percent of a typical top-2 gap). To
tell a flip from a bug, stock decodes freely and records its logits; kog then decodes the same request while its
sampled tokens are forced to stock's, and records its logits at every step. `compare` checks that the logits
agree within a stated tolerance at every step and that every step where kog's argmax differs had a stock top-2
margin within that tolerance.

The engine runs in a spawned process, in-process mode (VLLM_ENABLE_V1_MULTIPROCESSING=0), so that a proxy can be
put around the runner's sampler: it sees the logits of both the stock path and the kog path.

FP8 checkpoints (`fp8_parity_failures`): stock on Hopper quantises the activations to FP8 as well, kog keeps them
bf16, so kog is held to a bf16-activation reference recorded under the same forcing (kog's torch step on vLLM's
loaded FP8 weights), and to stock within a bound derived from the measured stock-vs-reference distance.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
from typing import Any

import torch
from vllm_helpers import child_result


@dataclasses.dataclass
class Recording:
    tokens: list[int]  # what the engine emitted (the forced tokens when forcing)
    logits: torch.Tensor  # [steps, vocab] float32, one row per sampled token
    kog_stats: dict[str, Any] | None
    num_cached_tokens: int | None = None  # prompt tokens vLLM's prefix cache served (RequestOutput.num_cached_tokens)


def _partial_prefill_chunk(input_batch: Any) -> bool:
    """A step of a chunked prefill before its last chunk (V2's InputBatch, one request): positions computed after
    the step < the prompt's. vLLM's runner calls its sampler on it too and drops the token."""
    done = int(input_batch.num_computed_tokens_np[0]) + int(input_batch.num_scheduled_tokens[0])
    return done < int(input_batch.prefill_len_np[0])


class _SamplerProxy:
    def __init__(self, sampler: Any, vocab: int, force: list[int] | None):
        self._sampler = sampler
        self._vocab = vocab
        self._force = force
        self.rows: list[torch.Tensor] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sampler, name)

    def __call__(self, logits: torch.Tensor, input_batch: Any) -> Any:
        assert logits.shape[0] == 1, "teacher forcing records single-request steps"
        if _partial_prefill_chunk(input_batch):  # vLLM samples it and discards the token: not a step of the output
            return self._sampler(logits, input_batch)
        self.rows.append(logits[0, : self._vocab].float().cpu())
        out = self._sampler(logits, input_batch)
        if self._force is not None and len(self.rows) <= len(self._force):
            out.sampled_token_ids.fill_(self._force[len(self.rows) - 1])
        return out


def seed_weights(model: torch.nn.Module, seed: int, std: float) -> None:
    """Overwrite a model's parameters in place, each from its own generator seeded by (seed, vLLM's parameter name):
    RMSNorm weights 1 + N(0, 0.02), every other tensor N(0, std), as the random-weight checkpoints draw them. For
    shapes whose checkpoint does not fit the device's disk, loaded with load_format="dummy" (vLLM's uniform +-1e-3,
    which makes every logit ~1e-4 and teacher forcing meaningless). Two engines of one shape get the same weights;
    in place, so the CUDA graphs and the kog path's pointers into vLLM's parameters stay valid."""
    import zlib

    with torch.no_grad():
        for name, p in model.named_parameters():
            g = torch.Generator(device=p.device).manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            if name.endswith("norm.weight"):
                p.normal_(1.0, 0.02, generator=g)
            else:
                p.normal_(0.0, std, generator=g)
    torch.cuda.synchronize()


def _record(queue: Any, model: str, engine_kwargs: dict, prompt_ids: list[int], max_tokens: int,
            force: list[int] | None, warm: list[list[int]] | None = None, reseed: tuple[int, float] | None = None) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    llm = LLM(model=model, **engine_kwargs)
    worker = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.worker
    runner = worker.model_runner
    if reseed is not None:
        seed_weights(runner.model, *reseed)
    if warm:  # earlier requests (one token each), e.g. to fill the prefix cache; their steps are not recorded
        llm.generate([{"prompt_token_ids": p} for p in warm], SamplingParams(temperature=0.0, max_tokens=1))
    before = worker.kog_stats() if hasattr(worker, "kog_stats") else None
    vocab = llm.llm_engine.model_config.get_vocab_size()
    proxy = _SamplerProxy(runner.sampler, vocab, force)
    runner.sampler = proxy
    sp = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    result = llm.generate([{"prompt_token_ids": prompt_ids}], sp)[0]
    out = result.outputs[0]
    stats = worker.kog_stats() if hasattr(worker, "kog_stats") else None
    if stats is not None and before is not None:  # the recorded request's steps only
        for key in ("kog_steps", "kog_tokens", "fallback_steps"):
            stats[key] = stats.get(key, 0) - before.get(key, 0)
    # numpy pickles by value: a torch tensor would travel as a file descriptor of this process's shared memory,
    # which the parent can no longer open once this process has exited (EOFError seen with the 8B shape's logits)
    queue.put((list(out.token_ids), torch.stack(proxy.rows).numpy(), stats, result.num_cached_tokens))


def record(model: str, engine_kwargs: dict, prompt_ids: list[int], max_tokens: int,
           force: list[int] | None = None, timeout_s: float = 600, warm: list[list[int]] | None = None,
           reseed: tuple[int, float] | None = None) -> Recording:
    """The greedy request's tokens and per-step logits in a fresh engine; `warm`: prompts generated first (one token
    each, not recorded; the kog counters returned are the recorded request's); `reseed` (seed, std): the loaded
    weights replaced by seed_weights' before the first request (for load_format="dummy")."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_record, args=(queue, model, engine_kwargs, prompt_ids, max_tokens, force, warm, reseed))
    proc.start()
    tokens, logits, stats, cached = child_result(proc, queue, timeout_s)
    return Recording(tokens, torch.from_numpy(logits), stats, cached)


@dataclasses.dataclass
class Comparison:
    steps: int
    max_abs_diff: float  # over all steps and vocabulary entries
    flips: list[tuple[int, float]]  # (step, stock top-2 margin) where kog's argmax differs from stock's token
    unexplained: list[tuple[int, float, float]]  # (step, margin, |diff| at the two tokens) beyond tolerance
    first_free_mismatch: int | None = None


def top2_margin(row: torch.Tensor, token: int) -> float:
    other = row.clone()
    other[token] = float("-inf")
    return float(row[token] - other.max())


def compare(stock: Recording, kog_forced: Recording, atol: float) -> Comparison:
    """kog's forced logits vs stock's free-running ones. A step where kog's argmax differs from stock's token is
    explained when stock's top-2 margin there is at most 2*atol (each side may move by atol)."""
    n = min(len(stock.tokens), kog_forced.logits.shape[0])
    diff = (kog_forced.logits[:n] - stock.logits[:n]).abs()
    flips, unexplained = [], []
    for i in range(n):
        want = stock.tokens[i]
        got = int(torch.argmax(kog_forced.logits[i]))
        if got != want:
            margin = top2_margin(stock.logits[i], want)
            flips.append((i, margin))
            if margin > 2 * atol:
                unexplained.append((i, margin, float(diff[i, [want, got]].max())))
    return Comparison(steps=n, max_abs_diff=float(diff.max()), flips=flips, unexplained=unexplained)


def parity_failures(stock: Recording, free: Recording, forced: Recording, atol: float) -> tuple[Comparison, list[str]]:
    """test_teacher_forcing's checks as a list of failures (empty: parity): kog's forced logits within atol of
    stock's at every step, every argmax flip at a stock top-2 margin <= 2 atol, and kog's free run equal to stock's
    or first differing at such a flip."""
    c = compare(stock, forced, atol)
    n = min(len(free.tokens), len(stock.tokens))
    c.first_free_mismatch = next((i for i in range(n) if free.tokens[i] != stock.tokens[i]), None)
    if c.first_free_mismatch is None and len(free.tokens) != len(stock.tokens):
        c.first_free_mismatch = n
    failures = []
    if c.max_abs_diff > atol:
        failures.append(f"max |dlogit| {c.max_abs_diff:.4f} > {atol}")
    if c.unexplained:
        failures.append(f"flips beyond 2 x atol: {c.unexplained}")
    if c.first_free_mismatch is not None and c.first_free_mismatch not in {i for i, _ in c.flips}:
        failures.append(f"free run differs from stock at step {c.first_free_mismatch}, not a flip step")
    return c, failures


# FP8 checkpoints: kog vs stock may differ by FP8_SPREAD x the measured stock-vs-reference distance plus the bf16
# bound (test_teacher_forcing.test_fp8_parity_under_teacher_forcing says why).
FP8_SPREAD = 1.25
# A guard, not a tolerance: the largest relative L2 distance ||L_ref - L_stock|| / ||L_stock|| of one step. Two
# unrelated logit vectors of equal norm are sqrt(2) ~ 1.41 apart; a reference that applied a scale wrongly is such a
# vector, while FP8 activation rounding (e4m3: 2^-4 relative at most per element) moves the logits by a few percent.
FP8_MAX_RELATIVE = 0.5


@dataclasses.dataclass
class Fp8Parity:
    stock_vs_reference: float  # measured max |L_ref - L_stock| over all steps and vocabulary entries
    relative: float  # measured max over steps of ||L_ref - L_stock|| / ||L_stock||
    kog_stock_bound: float  # FP8_SPREAD x stock_vs_reference + the bf16 bound
    vs_reference: Comparison  # kog's forced logits against the reference's (its argmax as the wanted token)
    vs_stock: Comparison  # kog's forced logits against stock's, its free run against stock's tokens


def argmax_recording(rec: Recording) -> Recording:
    """rec with its own argmax as the tokens (a forced recording's tokens are the forced ones)."""
    return Recording([int(torch.argmax(row)) for row in rec.logits], rec.logits, rec.kog_stats, rec.num_cached_tokens)


def fp8_parity_failures(stock: Recording, reference: Recording, free: Recording, forced: Recording, atol: float,
                        spread: float = FP8_SPREAD, max_relative: float = FP8_MAX_RELATIVE) -> tuple[Fp8Parity, list[str]]:
    """FP8 teacher forcing's checks as a list of failures (empty: parity). stock: stock's free run; reference: the
    bf16-activation torch step forced to stock's tokens; free, forced: kog's runs. kog within `atol` (the bf16
    bound) of the reference, argmax flips against it at reference top-2 margins <= 2 atol; kog within
    spread x d + atol of stock (d: the measured max |L_ref - L_stock|), with parity_failures' checks at that bound;
    the reference no further than max_relative from stock at any step."""
    n = min(stock.logits.shape[0], reference.logits.shape[0])
    delta = reference.logits[:n] - stock.logits[:n]
    d = float(delta.abs().max())
    relative = float((delta.norm(dim=1) / stock.logits[:n].norm(dim=1)).max())
    bound = spread * d + atol
    vs_reference = compare(argmax_recording(reference), forced, atol)
    vs_stock, stock_failures = parity_failures(stock, free, forced, bound)
    failures = []
    if relative > max_relative:
        failures.append(f"reference vs stock: relative distance {relative:.3f} > {max_relative} at a step: not FP8 "
                        "activation rounding (a scale applied wrongly on one side?)")
    if vs_reference.max_abs_diff > atol:
        failures.append(f"kog vs reference: max |dlogit| {vs_reference.max_abs_diff:.4f} > {atol}")
    if vs_reference.unexplained:
        failures.append(f"kog vs reference: flips beyond 2 x atol: {vs_reference.unexplained}")
    failures += [f"kog vs stock (bound {spread} x {d:.4f} + {atol}): {f}" for f in stock_failures]
    return Fp8Parity(d, relative, bound, vs_reference, vs_stock), failures
