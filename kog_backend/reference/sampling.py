"""vLLM 0.26's V2 sampler for one decode row, bit for bit, in torch (CPU or CUDA).

Stock path reproduced (vllm/v1/worker/gpu/sample/sampler.py `Sampler.sample`, one row, no logprobs, logit bias,
bad words or structured output; VLLM_USE_FLASHINFER_SAMPLER=0, use_fp64_gumbel as configured):

0. Penalties (sample/penalties.py `_penalties_kernel`), when any of repetition != 1, frequency != 0, presence != 0:
   with count = output_bin_counts[c] and in_prompt = prompt_bin_mask bit c, x = fp32(x);
   if rep != 1: x = x * (x > 0 ? 1 / s : s), s = rep where in_prompt or count > 0, else 1 (Triton's `1.0 / s` is
   div.full.f32 on the GPU: `Penalties.repetition_reciprocal` takes the GPU's value, as for temperature);
   x = x - freq * count, one rounding (Triton fuses it into an FMA); x = x - pres * (count > 0);
   written back into the logits tensor (bf16 logits are rounded to bf16 again).

1. Temperature (sample/gumbel.py `_temperature_kernel`): skipped when t == 0 or t == 1, else
   x = dtype(fp32(x) / t), written back into the logits tensor, so bf16 logits are rounded to bf16 again.
   Triton lowers the fp32 `/` to PTX `div.full.f32` (x * MUFU.RCP(t) on sm_90, at most 2 ulp from IEEE);
   `apply_temperature(..., reciprocal=r)` reproduces that when given r = div.full.f32(1, t) measured on the GPU.
   Without it the division is IEEE, which is what Triton's interpreter (numpy) computes.
2. min_p (sample/min_p.py): skipped when min_p == 0, else threshold = fp32(max(x)) + log(fp32(min_p)) and every
   x < threshold becomes -inf (in place, logits dtype).
3. top-k / top-p (v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p`): on CUDA with fewer than 8 rows it is
   `apply_top_k_top_p_pytorch` (sort based, allow_cpu_sync=False, so top-k alone also sorts). top_k <= 0 or
   > V means V (sample/states.py); top-k runs iff k != V, top-p iff fp32(p) != 1. Ascending sort of the row;
   top-k keeps every value >= the k-th largest value counted with multiplicity (all ties of the k-th value stay);
   top-p: probs = softmax(sorted, fp32), cums = cumsum(probs), masks sorted position i iff cums[i] <= 1 - p,
   never the last (largest) one. Ties in the sort are ordered by ascending vocabulary index (torch's CUDA sort is
   expected to be stable for rows longer than 32, checked by integration_tests/test_sampling_gpu.py; the CPU sort
   is not, so this module always sorts with stable=True): among
   equal values at the top-p boundary the lower indices are masked first. (Batches of 8+ rows use vLLM's Triton
   top-k/top-p kernel instead, whose tie handling differs; a lone decode row never takes it.)
4. Gumbel-max (sample/gumbel.py `gumbel_sample`, apply_temperature=False): if t != 0, for every vocabulary index
   i: gs = tl.randint(seed, pos) (Philox4x32-10, key = int64 seed, counter = (pos lo, pos hi, 0, 0), word 0);
   u = max(uint_to_uniform_float(Philox(key=(gs, 0), counter=(i, 0, 0, 0)) word 0), 2^-31 (1 - 2^-24));
   g = -log(-log1p(-u)) in fp32 (fp64 variant: u from words 0 and 1 as a 64-bit integer, g = -log(-log(u))).
   score = fp32(x) + g. Argmax per 1024-wide block (first index on ties), then torch.argmax over the block
   maxima (first block on ties): the winner is the lowest index holding the row's maximum score.
   `position` is the position of the token whose logits are sampled (input_batch.positions[logits_indices]),
   `seed` the request's SamplingParams.seed, or the random int64 vLLM drew for it (SamplingStates.seeds).

Transcendentals: log/log1p are torch's on the tensors' device. On CUDA these are libdevice's logf/log1pf, the
same polynomials Triton calls (Triton enables FTZ, which only differs on subnormal operands; none occur for
u in [2^-31, 1)). On CPU they are ATen's, which differ from numpy's (Triton's interpreter) in the last bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

import torch

MASK32 = 0xFFFFFFFF
PHILOX_ROUNDS = 10
# Philox4x32 constants (Salmon et al. 2011; triton/language/random.py).
PHILOX_KEY_A = 0x9E3779B9
PHILOX_KEY_B = 0xBB67AE85
PHILOX_ROUND_A = 0xD2511F53
PHILOX_ROUND_B = 0xCD9E8D57
# Random123's published known-answer vectors for philox4x32-10 (its kat_vectors file): (counter, key, output).
PHILOX_KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]  # fmt: skip
GUMBEL_BLOCK = 1024  # vLLM gumbel_sample's BLOCK_SIZE: columns per argmax block
# Triton uint_to_uniform_float's int32 scale, as fp32 bits 0x2FFFFFFF = 2^-31 (1 - 2^-24); also vLLM's clamp.
RAND32_SCALE = 4.6566127342e-10
RAND64_SCALE = 5.421010862427522170037e-20  # 2^-64 (vLLM tl_rand64)
RAND64_MIN = 2.2250738585072014e-308  # float64 tiny (vLLM tl_rand64 clamp)


# ---------------------------------------------------------------- Philox4x32-10 on int64 tensors (uint32 values)
def _mul32(a: torch.Tensor | int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product of uint32 values, in int64 via 16-bit limbs."""
    a_hi, a_lo = (a >> 16) & 0xFFFF, a & 0xFFFF
    b_hi, b_lo = (b >> 16) & 0xFFFF, b & 0xFFFF
    low = a_lo * b_lo
    mid = a_hi * b_lo + a_lo * b_hi + (low >> 16)  # < 2^34
    hi = a_hi * b_hi + (mid >> 16)
    lo = ((mid & 0xFFFF) << 16) | (low & 0xFFFF)
    return hi, lo


def philox4x32(
    c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor, k0: torch.Tensor, k1: torch.Tensor,
    rounds: int = PHILOX_ROUNDS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Triton's philox_impl (= Random123 philox4x32): counters c0..c3 and key k0, k1 are int64 tensors holding
    uint32 values (broadcastable); returns the four output words as int64 in [0, 2^32)."""
    for _ in range(rounds):
        hi_b, lo_b = _mul32(PHILOX_ROUND_B, c2)
        hi_a, lo_a = _mul32(PHILOX_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + PHILOX_KEY_A) & MASK32
        k1 = (k1 + PHILOX_KEY_B) & MASK32
    return c0, c1, c2, c3


def _u32(x: int) -> int:
    return x & MASK32


def randint4x(seed: int | torch.Tensor, offset: torch.Tensor, offset_bits: int = 32) -> tuple[torch.Tensor, ...]:
    """tl.randint4x(seed, offset): seed is an integer scalar (cast to uint64: int64 two's complement, uint32
    zero-extended) or an int64 tensor of such values broadcasting against offset; offset an integer tensor of a
    Triton type `offset_bits` wide (32: counter (offset, 0, 0, 0); 64: (lo, hi of the int64 offset, 0, 0))."""
    off = offset.to(torch.int64)
    lo = off & MASK32
    hi = (off >> 32) & MASK32 if offset_bits == 64 else torch.zeros_like(lo)
    zero = torch.zeros_like(lo)
    if isinstance(seed, torch.Tensor):
        s = seed.to(device=off.device, dtype=torch.int64)
        k0, k1 = (s & MASK32).expand_as(lo), ((s >> 32) & MASK32).expand_as(lo)
    else:
        seed64 = seed & ((1 << 64) - 1)
        k0 = torch.full_like(lo, _u32(seed64))
        k1 = torch.full_like(lo, _u32(seed64 >> 32))
    return philox4x32(lo, hi, zero, zero, k0, k1)


def randint(seed: int | torch.Tensor, offset: torch.Tensor, offset_bits: int = 32) -> torch.Tensor:
    """tl.randint: word 0 of randint4x."""
    return randint4x(seed, offset, offset_bits)[0]


def gumbel_seed(seed: int, position: int) -> int:
    """vLLM's per-(request, position) key: tl.randint(int64 seed, int64 pos), a uint32."""
    return int(randint(seed, torch.tensor([position], dtype=torch.int64), offset_bits=64)[0])


def uint_to_uniform_float(x: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float for 32-bit words (int64 tensor of uint32 values) -> fp32 in [0, 1):
    reinterpret as int32, fold negatives with -x - 1, convert (round to nearest even), times fp32 2^-31(1-2^-24)."""
    signed = torch.where(x >= 2**31, x - 2**32, x)
    folded = torch.where(signed < 0, -signed - 1, signed).to(torch.int32)
    return folded.to(torch.float32) * torch.tensor(RAND32_SCALE, dtype=torch.float32, device=x.device)


def rand32(key: int | torch.Tensor, offset: torch.Tensor, includes_zero: bool = False) -> torch.Tensor:
    """vLLM's tl_rand32(key, offset) = tl.rand, clamped to >= RAND32_SCALE unless includes_zero; int32 offsets."""
    u = uint_to_uniform_float(randint(key, offset, offset_bits=32))
    if not includes_zero:
        u = torch.clamp_min(u, torch.tensor(RAND32_SCALE, dtype=torch.float32, device=u.device))
    return u


def rand64(key: int | torch.Tensor, offset: torch.Tensor, includes_zero: bool = False) -> torch.Tensor:
    """vLLM's tl_rand64: words 0 (low) and 1 (high) as a uint64 -> float64 (one rounding) times 2^-64."""
    lo, hi, _, _ = randint4x(key, offset, offset_bits=32)
    r = hi.to(torch.float64) * 4294967296.0 + lo.to(torch.float64)  # hi * 2^32 exact; one rounding in the add
    u = r * RAND64_SCALE
    if not includes_zero:
        u = torch.clamp_min(u, RAND64_MIN)
    return u


def gumbel_from_uniform(u: torch.Tensor) -> torch.Tensor:
    """vLLM's noise: fp32 -log(-log1p(-u)); fp64 -log(-log(u)). Triton's unary minus is 0 - x (+0 for x = +0)."""
    if u.dtype == torch.float64:
        return 0.0 - torch.log(0.0 - torch.log(u))
    return 0.0 - torch.log(0.0 - torch.log1p(0.0 - u))


def gumbel_noise(seed: int, position: int, vocab_size: int, device: torch.device | str = "cpu",
                 use_fp64: bool = False) -> torch.Tensor:
    """Noise for columns 0..vocab_size-1 of the row sampled at `position` (fp32, or fp64 if use_fp64). Computed
    over whole 1024-column blocks, as the kernel does, then cut to the vocabulary."""
    padded = -(-vocab_size // GUMBEL_BLOCK) * GUMBEL_BLOCK
    cols = torch.arange(padded, dtype=torch.int64, device=device)
    key = gumbel_seed(seed, position)
    u = rand64(key, cols) if use_fp64 else rand32(key, cols)
    return gumbel_from_uniform(u)[:vocab_size]


# ---------------------------------------------------------------- logits processing, in vLLM's order
def _f32(v: float, device) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32, device=device)


def apply_temperature(logits: torch.Tensor, temperature: float, reciprocal: float | None = None) -> torch.Tensor:
    """_temperature_kernel on one row: x = dtype(fp32(x) / t) unless t is 0 or 1. `reciprocal`: fp32
    div.full.f32(1, t) as the GPU computes it; then x * reciprocal reproduces Triton's GPU division."""
    t = _f32(temperature, logits.device)
    if t.item() == 0.0 or t.item() == 1.0:
        return logits
    x = logits.to(torch.float32)
    x = x * _f32(reciprocal, logits.device) if reciprocal is not None else x / t
    return x.to(logits.dtype)


@dataclass(frozen=True)
class Penalties:
    """A request's penalties as vLLM's PenaltiesState holds them for one row: which ids the prompt holds (bool [V]),
    how often each id was generated so far (int [V], the draft tokens of this step included), fp32 values."""

    prompt_mask: torch.Tensor
    output_counts: torch.Tensor
    repetition: float = 1.0
    frequency: float = 0.0
    presence: float = 0.0
    repetition_reciprocal: float | None = None  # div.full.f32(1, repetition) as the GPU computes it; None: IEEE

    @property
    def active(self) -> bool:
        return _f32(self.repetition, "cpu").item() != 1.0 or self.frequency != 0.0 or self.presence != 0.0


def _round_f32(exact: Fraction) -> float:
    """The fp32 value nearest to `exact` (ties to even): one rounding, as an FMA rounds."""
    c = np.float32(float(exact))
    best = min(
        (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))),
        key=lambda v: (abs(Fraction(float(v)) - exact), int(np.array(v).view(np.int32)) & 1),
    )
    return float(best)


def apply_penalties(logits: torch.Tensor, penalties: Penalties | None) -> torch.Tensor:
    """_penalties_kernel on one row (see the module docstring, stage 0)."""
    if penalties is None or not penalties.active:
        return logits
    dev = logits.device
    rep, freq, pres = (_f32(v, dev) for v in (penalties.repetition, penalties.frequency, penalties.presence))
    counts = penalties.output_counts.to(device=dev, dtype=torch.int64)
    seen = counts > 0
    x = logits.to(torch.float32)
    if rep.item() != 1.0:
        inv = _f32(penalties.repetition_reciprocal, dev) if penalties.repetition_reciprocal is not None else 1.0 / rep
        hit = penalties.prompt_mask.to(dev) | seen
        one = torch.ones_like(x)
        x = x * torch.where(x > 0, torch.where(hit, inv, one), torch.where(hit, rep, one))
    if freq.item() != 0.0:
        x = x.clone()
        f = Fraction(float(freq.item()))
        for c in seen.nonzero().squeeze(1).tolist():  # count 0 leaves x as it is
            x[c] = _round_f32(Fraction(float(x[c].item())) - f * int(counts[c]))
    x = x - torch.where(seen, pres, torch.zeros_like(pres))
    return x.to(logits.dtype)


def apply_min_p(logits: torch.Tensor, min_p: float) -> torch.Tensor:
    """_min_p_kernel on one row."""
    m = _f32(min_p, logits.device)
    if m.item() == 0.0:
        return logits
    threshold = logits.to(torch.float32).max() + torch.log(m)
    return torch.where(logits.to(torch.float32) < threshold, torch.full_like(logits, float("-inf")), logits)


def normalize_top_k_top_p(top_k: int, top_p: float, vocab_size: int) -> tuple[int | None, float | None]:
    """SamplingStates' storage and Sampler.get_top_k_top_p's gating: (k or None, fp32 p or None)."""
    k = vocab_size if top_k <= 0 or top_k > vocab_size else top_k
    p = _f32(top_p, "cpu").item()
    return (k if k != vocab_size else None), (p if p != 1.0 else None)


def apply_top_k_top_p(logits: torch.Tensor, top_k: int | None, top_p: float | None) -> torch.Tensor:
    """apply_top_k_top_p_pytorch on one row ([V], any float dtype), with the stable ascending sort."""
    if top_k is None and top_p is None:
        return logits
    row = logits.unsqueeze(0).clone()
    logits_sort, logits_idx = row.sort(dim=-1, descending=False, stable=True)
    if top_k is not None:
        k = torch.tensor([top_k], dtype=torch.int32, device=row.device)
        top_k_mask = logits_sort.size(1) - k.to(torch.long)
        top_k_mask = logits_sort.gather(1, top_k_mask.unsqueeze(dim=1))
        logits_sort.masked_fill_(logits_sort < top_k_mask, -float("inf"))
    if top_p is not None:
        p = torch.tensor([top_p], dtype=torch.float32, device=row.device)
        probs_sort = logits_sort.softmax(dim=-1, dtype=torch.float32)
        probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
        top_p_mask = probs_sum <= 1 - p.unsqueeze(dim=1)
        top_p_mask[:, -1] = False
        logits_sort.masked_fill_(top_p_mask, -float("inf"))
    return row.scatter_(dim=-1, index=logits_idx, src=logits_sort)[0]


def bf16_order_key(x: torch.Tensor) -> torch.Tensor:
    """sampling.cuh's 16-bit order key of bf16 values (int64): monotone in the value, -0 and +0 share a key."""
    u = x.contiguous().view(torch.int16).to(torch.int64) & 0xFFFF
    u = torch.where(u == 0x8000, torch.zeros_like(u), u)
    return torch.where(u >= 0x8000, (~u) & 0xFFFF, u | 0x8000)


# ---------------------------------------------------------------- in-burst top-k / top-p / min-p (the kernel's schedule)
LEVELS = 1 << 16  # bf16 order keys
NO_LEVEL = LEVELS  # a cut above every level: no row is surely kept
MAX_EXP_ARG = 700.0  # burst_sampling.cuh kMaxExpArg: exp(x) in fp64 must not overflow


def level_values() -> torch.Tensor:
    """fp32 value of every level (the inverse of bf16_order_key; level 0x8000 is +0, NaN levels stay NaN)."""
    lv = torch.arange(LEVELS, dtype=torch.int64)
    u = torch.where(lv >= 0x8000, lv & 0x7FFF, (~lv) & 0xFFFF)
    return (u << 16).to(torch.int32).view(torch.float32)


def top_p_rho(survivors: int, span: float) -> float:
    """burst_sampling.cuh top_p_rho: a bound on vLLM's relative fp32 error in a kept row's ascending cumulative
    probability, for `survivors` nonzero softmax terms whose logits lie within `span` of the maximum."""
    if not math.isfinite(span):  # a survivor at -inf (never from the LM head): the kernel's rho is inf too
        return math.inf
    return (2.0 * survivors + 2.0 * math.ceil(span) + 20.0) * 2.0**-24


def _bf16_round_up(v: float) -> torch.Tensor:
    """The smallest bf16 >= fp32 v (__float2bfloat16_ru)."""
    f = torch.tensor([v], dtype=torch.float32)
    b = f.to(torch.bfloat16)
    if b.float().item() < f.item():
        key = bf16_order_key(b) + 1
        b = torch.tensor([level_values()[int(key)].item()], dtype=torch.float32).to(torch.bfloat16)
    return b


MAX_SPLIT = 64  # burst_sampling.cuh kMaxSplit: rows of a split level the kernel ranks


@dataclass(frozen=True)
class BurstCut:
    """burst_sampling.cuh's Cut: vLLM keeps no row below level `cand` and every row at or above level `sure`
    (NO_LEVEL: none for certain). `split` (or NO_LEVEL): the one level in [cand, sure), whose `n` rows vLLM keeps by
    column: in ascending column order ranks 1..j_lo are masked for certain, j_lo + 1..j_hi undecided, the rest
    kept for certain."""

    cand: int
    sure: int
    split: int = NO_LEVEL
    j_lo: int = 0
    j_hi: int = 0
    n: int = 0


def burst_cut(x: torch.Tensor, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> BurstCut:
    """The cut burst_sampling.cuh's cutter finds for a row x ([V] bf16, after temperature) and vLLM's filters as
    SamplingStates holds them (top_k 0 = off, top_p 1 = off).

    From the count of columns per level: the top level M; min_p's lowest level (the smallest bf16 >= fp32(M) +
    log(fp32(min_p)), vLLM's threshold); top-k's (the highest level with >= k rows at or above it); then, with
    top-p, exact masses exp(x) per level over the survivors: a row whose exact ascending cumulative probability c
    is <= q / (1 + rho) is masked by vLLM, > q / (1 - rho) kept (q = fp32(1 - p); rho: top_p_rho). cand is the
    first level holding a row above the first bound, sure the first level whose lowest row is above the second
    (else the next non-empty level); when only the level cand lies between them, its rows are ranked. (On the CPU,
    whatever x's device.)"""
    lv = bf16_order_key(x.cpu())
    hist = torch.bincount(lv, minlength=LEVELS)
    values = level_values()
    top = int(lv.max())
    m = float(values[top])
    lo = 0
    if min_p > 0.0:
        thr = torch.tensor(m, dtype=torch.float32) + torch.log(torch.tensor(min_p, dtype=torch.float32))
        lo = int(bf16_order_key(_bf16_round_up(float(thr)))[0])
    if top_k > 0:
        from_top = hist.flip(0).cumsum(0)
        lo = max(lo, LEVELS - 1 - int((from_top >= top_k).nonzero()[0]))
    if not torch.tensor(top_p, dtype=torch.float32).item() < 1.0:
        return BurstCut(lo, lo)
    if not m <= MAX_EXP_ARG:
        return BurstCut(lo, NO_LEVEL)
    n = hist[lo:].to(torch.float64)
    e = torch.exp(values[lo:].to(torch.float64))
    mass = torch.where(n > 0, n * e, torch.zeros_like(n))
    z = float(mass.sum())
    # The lowest survivor's value bounds vLLM's exp arguments: exact within lo's bin of 256 levels, else the
    # start of the lowest non-empty bin above (a lower value: a larger, safe bound), as the kernel takes it.
    b_lo = lo >> 8
    in_bin = (n[: (b_lo + 1) * 256 - lo] > 0).nonzero()
    if in_bin.numel():
        lowest = lo + int(in_bin[0])
    else:
        lowest = (b_lo + 1) * 256 + int((hist[(b_lo + 1) * 256 :].view(-1, 256).sum(1) > 0).nonzero()[0]) * 256
    rho = top_p_rho(int(n.sum()), m - float(values[lowest]))
    if not (0.0 < z < math.inf) or not rho < 0.25:
        return BurstCut(lo, NO_LEVEL)
    q = (torch.tensor(1.0, dtype=torch.float32) - torch.tensor(top_p, dtype=torch.float32)).item()
    t_lo, t_hi = q / (1.0 + rho) * z, q / (1.0 - rho) * z
    end = torch.cumsum(mass, 0)
    nonempty = n > 0
    jc = int((nonempty & (end > t_lo)).nonzero()[0])
    cand = lo + jc
    above = (nonempty & (end > t_hi)).nonzero()
    sure = NO_LEVEL
    if above.numel():
        j = int(above[0])
        if float(end[j] - mass[j] + e[j]) > t_hi:
            sure = lo + j
        else:
            nxt = nonempty[j + 1 :].nonzero()
            sure = lo + j + 1 + int(nxt[0]) if nxt.numel() else NO_LEVEL
    sure = max(sure, cand)
    after = nonempty[jc + 1 :].nonzero()
    next_level = lo + jc + 1 + int(after[0]) if after.numel() else NO_LEVEL
    n_c = int(n[jc])
    if cand < sure and next_level == sure and n_c <= MAX_SPLIT:
        start, one = float(end[jc] - mass[jc]), float(e[jc])

        def ranks_at_or_below(t: float) -> int:
            return int(min(max(math.floor((t - start) / one), 0), n_c))

        j_lo = ranks_at_or_below(t_lo)
        return BurstCut(cand, sure, cand, j_lo, max(j_lo, ranks_at_or_below(t_hi)), n_c)
    return BurstCut(cand, sure)


def burst_token(
    logits: torch.Tensor, *, temperature: float, seed: int, position: int, top_k: int = 0, top_p: float = 1.0,
    min_p: float = 0.0, div_full_reciprocal: float | None = None, penalties: Penalties | None = None,
) -> int | None:
    """The token a filtered burst draws from one row of bf16 logits ([V]), or None where it defers the draw to
    vLLM's sampler. top_k, top_p as sample() takes them (vLLM's normalisation applies). Whenever it returns a
    token, that token is sample(...).token: the draw is argmax(fp32(x) + noise) over every row vLLM may keep (a
    split level's rows ranked by column), and the winner is one vLLM keeps for certain."""
    assert logits.dim() == 1 and temperature > 0.0
    logits = apply_penalties(logits.cpu(), penalties)
    v = logits.shape[0]
    x = apply_temperature(logits, temperature, div_full_reciprocal)
    k, p = normalize_top_k_top_p(top_k, top_p, v)
    cut = burst_cut(x, k or 0, 1.0 if p is None else p, min_p)
    lv = bf16_order_key(x)
    scores = x.float() + gumbel_noise(seed, position, v, logits.device)
    candidate = lv >= cut.cand
    sure = lv >= cut.sure
    at_split = lv == cut.split
    if bool(at_split.any()):
        cols = at_split.nonzero().squeeze(1)  # ascending: rank i + 1
        ranks = torch.zeros_like(lv)
        ranks[cols] = torch.arange(1, cols.numel() + 1)
        candidate &= ~(at_split & (ranks <= cut.j_lo))
        sure = torch.where(at_split, ranks > cut.j_hi, sure)
    scores = torch.where(candidate, scores, torch.full_like(scores, float("-inf")))
    token, _, _ = block_argmax(scores)
    return token if bool(sure[token]) else None


def block_argmax(scores: torch.Tensor) -> tuple[int, torch.Tensor, torch.Tensor]:
    """gumbel_sample's reduction: per-1024-block (max, first argmax), then the first block holding the largest
    block max. Returns (token, block maxima, block argmaxes as vocabulary indices)."""
    v = scores.shape[0]
    nb = -(-v // GUMBEL_BLOCK)
    padded = torch.full((nb * GUMBEL_BLOCK,), float("-inf"), dtype=scores.dtype, device=scores.device)
    padded[:v] = scores
    blocks = padded.view(nb, GUMBEL_BLOCK)
    local_idx = blocks.argmax(dim=1)
    local_max = blocks.gather(1, local_idx.unsqueeze(1)).squeeze(1)
    local_tok = local_idx + torch.arange(nb, device=scores.device) * GUMBEL_BLOCK
    return int(local_tok[local_max.argmax()]), local_max, local_tok


@dataclass
class SampleTrace:
    """Every intermediate of one `sample` call, for piecewise comparison with a kernel."""

    after_penalties: torch.Tensor
    after_temperature: torch.Tensor
    after_min_p: torch.Tensor
    after_top_k_top_p: torch.Tensor
    gumbel_seed: int | None
    noise: torch.Tensor | None
    scores: torch.Tensor
    token: int


def sample(
    logits: torch.Tensor,
    *,
    temperature: float,
    seed: int,
    position: int,
    top_k: int = 0,
    top_p: float = 1.0,
    min_p: float = 0.0,
    use_fp64: bool = False,
    div_full_reciprocal: float | None = None,
    penalties: Penalties | None = None,
) -> SampleTrace:
    """The token vLLM's V2 sampler draws for one row of logits ([V], the model's logits dtype)."""
    assert logits.dim() == 1
    v = logits.shape[0]
    after_pen = apply_penalties(logits, penalties)
    x = apply_temperature(after_pen, temperature, div_full_reciprocal)
    after_t = x
    x = apply_min_p(x, min_p)
    after_m = x
    k, p = normalize_top_k_top_p(top_k, top_p, v)
    x = apply_top_k_top_p(x, k, p)
    scores = x.to(torch.float64 if use_fp64 else torch.float32)
    gs, noise = None, None
    if _f32(temperature, "cpu").item() != 0.0:
        gs = gumbel_seed(seed, position)
        noise = gumbel_noise(seed, position, v, logits.device, use_fp64)
        scores = scores + noise
    token, _, _ = block_argmax(scores)
    return SampleTrace(after_pen, after_t, after_m, x, gs, noise, scores, token)
