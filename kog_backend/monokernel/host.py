"""Host side of the monokernel: `Monokernel`, which builds the argument table once from
vLLM's own tensors (no weight is copied or repacked) and launches one step per call. Whether it can run a model
is the gate's decision (kog_backend.path.gate.monokernel.unsupported_reason, re-exported here).

Scratch per layer (bf16 unless noted; kept per layer so every stage is checkable on its own):
  qkv_out [(nh + 2 nkv) D], q_out [nh D], attn_out [nh D], o_out [H], rmid [H], act [I], down_out [H],
  rin_next [H]; attn_ml fp32 [nh, S, 2], attn_acc fp32 [nh, S, D].
For Llama-3.2-1B that is 0.7 MB in all, plus 2.2 MB of attention partials.

FP8 weights (weights.fp8 set; TP = 1): the table points at the four projections' float8 bytes and their fp32
scales, ModelArgs::fp8_scaling says their layout (layout.FP8_SCALING), the plan streams one byte per element
(make_plan's weight_bytes) and the launch runs the FP8 kernel instantiation (MonokernelLaunch's fp8_weights).

Mixture of experts (weights a moe_step.MoeDecoderWeights; TP = 1, bf16): the MoE kernel instantiation
(MonokernelLaunch's moe; csrc/include/kog/moe_stages.cuh) on moe_plan's schedule. The layer table's gate_up / down
point at vLLM's fused w13 / w2, act holds every slot's silu(gate) * up (k I), and the router's logits and each
layer's route (expert ids, then the fp32 weights' bits, 2 kMoeMaxTopK words) live in buffers of their own.
"""

from __future__ import annotations

import math

import torch

from kog_backend import ops as kog_ops
from kog_backend.monokernel import layout
from kog_backend.monokernel.moe_plan import MoePlan
from kog_backend.monokernel.plan import Plan, lm_rows
from kog_backend.monokernel.tp_layout import tp_buffer_layout
from kog_backend.path.gate import monokernel as gate
from kog_backend.path.gate.monokernel import unsupported_reason
from kog_backend.path.gate.tiling import MOE_MAX_TOP_K  # a layer's route row: 2 x this many int32 words
from kog_backend.path.model_spec import SCALE_FIELDS, DecoderWeights

_BF16_FIELDS = ("qkv_out", "q_out", "attn_out", "o_out", "rmid", "act", "down_out", "rin_next")


def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


class Monokernel:
    """One persistent launch per decode step on vLLM's weights and paged KV cache (module docstring)."""

    def __init__(
        self,
        weights: DecoderWeights,
        kv_caches: list[torch.Tensor],
        device: torch.device | str,
        max_model_len: int,
        max_tokens_per_launch: int = 1,
        sm_count: int | None = None,
        tp_buffer=None,
    ):
        """sm_count: blocks to launch (default: every SM; ranks sharing one GPU under MPS take a share each).
        tp_buffer: at tensor parallelism, this rank's kog_backend.collective.ipc.SharedBuffer of at least
        tp_layout.tp_buffer_layout(shape, world).nbytes, created by every rank of the group; weights.embed must then be the
        whole embedding table (the kernel reads any token's row), the other weights vLLM's shards."""
        device = torch.device(device)
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        world = 1 if tp_buffer is None else len(tp_buffer.bases)
        if sm_count is not None and not 1 <= sm_count <= _sm_count(device):
            raise ValueError(f"sm_count {sm_count} outside 1..{_sm_count(device)}")
        reason = unsupported_reason(weights, kv_caches, device, sm_count=sm_count, tp_world=world)
        if reason is not None:
            raise ValueError(f"monokernel unsupported: {reason}")
        s = weights.shape
        reason = gate.context_reason(max_model_len, weights.cos_sin.shape[0])
        if reason is not None:
            raise ValueError(reason)
        self.ops = kog_ops.ops()
        self.shape = s
        self.device = device
        self.max_model_len = max_model_len
        moe = getattr(weights, "moe", None)
        plan = gate.plan_or_reason(weights, sm_count or _sm_count(device), world)
        self.moe_plan: MoePlan | None = plan if isinstance(plan, MoePlan) else None
        if self.moe_plan is not None:
            plan = self.moe_plan.kernel
        assert isinstance(plan, Plan)
        self.plan = plan
        self.head_dim = s.head_dim
        self.fp8_weights = weights.fp8 is not None  # the FP8 kernel instantiation
        self.moe = moe is not None  # the MoE kernel instantiation
        reason = self.residency_reason(world > 1)
        if reason is not None:
            raise ValueError(reason)
        self._weights = weights  # keeps every pointer in the table alive
        self._kv_caches = list(kv_caches)
        L, H, D, I, nh, nkv, S = (
            s.num_layers, s.hidden_size, s.head_dim, s.intermediate_size, s.num_heads, s.num_kv_heads,
            plan.num_splits,
        )  # fmt: skip
        if moe is not None:
            I = moe.top_k * moe.intermediate_size  # act: every slot's  # noqa: E741
        sizes = {
            "qkv_out": (nh + 2 * nkv) * D, "q_out": nh * D, "attn_out": nh * D, "o_out": H, "rmid": H,
            "act": I, "down_out": H, "rin_next": H,
        }  # fmt: skip
        per_layer = sum(_round8(n) for n in sizes.values())
        self.scratch = torch.empty(L * per_layer, dtype=torch.bfloat16, device=device)
        self.partials = torch.empty(L * (nh * S * 2 + nh * S * D), dtype=torch.float32, device=device)
        # (MoE: two more per layer after the dense ones, the router's count and its route: ModelArgs::moe_ctr_base)
        dense_counters = layout.num_counters(L, nkv)
        moe_counters = 2 * L * layout.CONFIG["kCounterStride"] if moe is not None else 0
        self.counters = torch.zeros(dense_counters + moe_counters, dtype=torch.int32, device=device)
        # Tagged words of each layer's act | qkv_out | attn_out (qkv_out and attn_out carry every TP = 1 launch's
        # attention chain; act only the tagged_handoffs benchmark variant): zero means "not written", so they are
        # zeroed with the counters.
        self.act_tagged = torch.zeros(L * layout.tagged_layer_words(I, nh, nkv, D), dtype=torch.int32, device=device)
        tp_fields = {"tp_size": 1, "tp_rank": 0, "tp_parts": 0, "tp_keys": 0, "tp_delta": [0] * layout.CONFIG["kMaxTP"]}
        counters_ptr = self.counters.data_ptr()
        self._tp_buffer = tp_buffer
        self.tp_world = world
        if tp_buffer is not None:
            lay = tp_buffer_layout(s, world)
            if tp_buffer.nbytes < lay.nbytes:
                raise ValueError(f"shared buffer of {tp_buffer.nbytes} B, the TP monokernel needs {lay.nbytes} B")
            base = tp_buffer.bases[tp_buffer.rank]
            if s.tp_rank != tp_buffer.rank:
                raise ValueError(f"weights of rank {s.tp_rank} with the shared buffer of rank {tp_buffer.rank}")
            counters_ptr = base + lay.counters
            deltas = [b - base for b in tp_buffer.bases] + [0] * (layout.CONFIG["kMaxTP"] - world)
            tp_fields = {"tp_size": world, "tp_rank": tp_buffer.rank, "tp_parts": base + lay.parts,
                         "tp_keys": base + lay.keys, "tp_delta": deltas}  # fmt: skip
        self._counters_ptr = counters_ptr
        # The launch outcome (ModelArgs::status_out): each launch's last block writes its abort word here, 0 when
        # every wait completed. Pinned host memory, which under UVA the device writes through the same address; the
        # host reads it once the launch is done (stream order: vLLM waited for the step's output behind it).
        self.status = torch.zeros(1, dtype=torch.int32, pin_memory=True)
        self.argmax_slots = torch.zeros(plan.grid, dtype=torch.int64, device=device)
        # Top-k / top-p / min-p draws (burst_sampling.cuh, TP = 1): zero between tokens, the kernel keeps it so.
        self.sample_work = None
        if tp_buffer is None:
            self.sample_work = torch.zeros(layout.CONFIG["sample_grid_bytes"], dtype=torch.uint8, device=device)
        self.logits_scratch = torch.empty(lm_rows(s), dtype=torch.bfloat16, device=device)
        # Penalised draws (penalties.cuh, TP = 1): one count per LM-head row of this launch's tokens; zero between
        # launches, the kernel keeps it so.
        self.burst_counts = None
        if tp_buffer is None:
            self.burst_counts = torch.zeros(lm_rows(s), dtype=torch.int32, device=device)
        self.buffers: list[dict[str, torch.Tensor]] = []
        layer_values = []
        off, poff = 0, 0
        for i, lw in enumerate(weights.layers):
            views: dict[str, torch.Tensor] = {}
            for name, n in sizes.items():
                views[name] = self.scratch[off : off + n]
                off += _round8(n)
            views["attn_ml"] = self.partials[poff : poff + nh * S * 2].view(nh, S, 2)
            poff += nh * S * 2
            views["attn_acc"] = self.partials[poff : poff + nh * S * D].view(nh, S, D)
            poff += nh * S * D
            self.buffers.append(views)
            kv = kv_caches[i]
            v = {
                "input_norm": lw.input_norm, "qkv": lw.qkv, "q_norm": lw.q_norm, "k_norm": lw.k_norm,
                "o_proj": lw.o_proj, "post_norm": lw.post_norm,
                "gate_up": lw.w13 if moe is not None else lw.gate_up, "down": lw.w2 if moe is not None else lw.down,
                "qkv_bias": lw.qkv_bias,
            }  # fmt: skip
            vals = {k: (t.data_ptr() if t is not None else 0) for k, t in v.items()}
            vals["k_cache"] = kv.data_ptr()
            vals["v_cache"] = kv.data_ptr() + D * kv.element_size()
            vals.update({k: t.data_ptr() for k, t in views.items()})
            layer_values.append(vals)
        self.layer_table = _to_device(layout.pack_layers(layer_values), device)
        # FP8: the four projections' scale pointers per layer (kog::Fp8LayerScales rows, layout.FP8_SCALE_FIELDS)
        self.fp8_scale_table = None
        if self.fp8_weights:
            rows = [[getattr(lw, SCALE_FIELDS[n]).data_ptr() for n in layout.FP8_SCALE_FIELDS] for lw in weights.layers]
            self.fp8_scale_table = torch.tensor(rows, dtype=torch.int64, device=device)
        kv0 = kv_caches[0]
        bs = kv0.shape[2]
        if bs < layout.CONFIG["kAttnTileLen"] or bs & (bs - 1):
            # The attention split finds a row's block by a shift and reads a 16-position tile from one block.
            raise ValueError(f"KV block size {bs}: the monokernel needs a power of two >= {layout.CONFIG['kAttnTileLen']}")
        moe_fields = {name: 0 for name, _, _ in layout.MODEL_FIELDS if name.startswith("moe_")}  # a dense table's
        self.moe_logits = self.moe_route = self.moe_routers = None
        if moe is not None:
            self.moe_logits = torch.empty(L, moe.num_experts, dtype=torch.bfloat16, device=device)
            self.moe_route = torch.zeros(L, 2 * MOE_MAX_TOP_K, dtype=torch.int32, device=device)
            self.moe_routers = torch.tensor([lw.router.data_ptr() for lw in weights.layers], dtype=torch.int64,
                                            device=device)  # fmt: skip
            moe_fields = {
                "moe_top_k": moe.top_k, "moe_experts": moe.num_experts, "moe_norm_topk": int(moe.norm_topk_prob),
                "moe_inter": moe.intermediate_size, "moe_router_nu": self.moe_plan.router.nu,
                "moe_router_chunks": self.moe_plan.router.chunks,
                "moe_ctr_base": dense_counters // layout.CONFIG["kCounterStride"],
                "moe_routers": self.moe_routers.data_ptr(), "moe_logits": self.moe_logits.data_ptr(),
                "moe_route": self.moe_route.data_ptr(),
            }  # fmt: skip
        model = {
            "num_layers": L, "hidden": H, "num_heads": nh, "num_kv_heads": nkv, "head_dim": D, "inter": I,
            "block_size": bs, "num_splits": S, "grid": plan.grid, "num_slots": plan.num_slots,
            "qk_norm": int(s.qk_norm), "max_position": weights.cos_sin.shape[0], "work_bytes": plan.work_bytes,
            "prefetch_chunks": layout.CONFIG["kPrefetchChunks"],
            "stage_end_copies": layout.CONFIG["kStageEndCopies"],
            "attn_end_copies": layout.CONFIG["kAttnEndCopies"],
            "attn_single_ctx": layout.CONFIG["kAttnSingleCtx"],
            "stall_prefetch_chunks": layout.CONFIG["kStallPrefetchChunks"],
            "max_inflight": layout.CONFIG["kMaxInflight"],
            "tagged_handoffs": layout.CONFIG["kTaggedHandoffs"],
            "stage_k": [p.k for p in plan.stages], "stage_n": [p.n for p in plan.stages],
            "stage_nu": [p.nu for p in plan.stages], "stage_chunks": [p.chunks for p in plan.stages],
            "kv_stride_block": kv0.stride(0), "kv_stride_pos": kv0.stride(2), "kv_stride_head": kv0.stride(1),
            "rms_eps": s.rms_eps, "attn_scale_log2": D**-0.5 * math.log2(math.e),
            "embed": weights.embed.data_ptr(), "final_norm": weights.final_norm.data_ptr(),
            "lm_head": weights.lm_head.data_ptr(), "cos_sin": weights.cos_sin.data_ptr(),
            "layers": self.layer_table.data_ptr(), "counters": counters_ptr,
            "argmax_slots": self.argmax_slots.data_ptr(), "logits_scratch": self.logits_scratch.data_ptr(),
            "act_tagged": self.act_tagged.data_ptr(),
            "trace": 0,
            "vocab_start": s.vocab_start, **tp_fields,
            "sample_work": self.sample_work.data_ptr() if self.sample_work is not None else 0,
            "status_out": self.status.data_ptr(), "inject_fault": 0,
            "slot_bytes": plan.slot_bytes, "fp8_scaling": layout.FP8_SCALING[weights.fp8],
            "fp8_scales": self.fp8_scale_table.data_ptr() if self.fp8_scale_table is not None else 0,
            "attn_mode": layout.CONFIG["kAttnMode"],
            "attn_prefetch": layout.CONFIG["kAttnPrefetchRounds"],
            **moe_fields,
        }  # fmt: skip
        self._model_values = model
        self.model_table = _to_device(layout.pack_model(model), device)
        self.block_size = bs
        self.max_tokens_per_launch = max_tokens_per_launch
        self._tokens = torch.empty(max(1, max_tokens_per_launch), dtype=torch.int64, device=device)
        self._num_out = torch.zeros(1, dtype=torch.int32, device=device)
        # What every launch of this object shares (torch.classes.kog.MonokernelLaunch; checked once, here): the
        # table, the scratch the kernel writes, the kernel instantiation and launch shape, the penalties' counts.
        self._classes = kog_ops.classes()  # torch.classes.kog, looked up once: generate builds its arguments per launch
        self.launch = self._classes.MonokernelLaunch(
            self.model_table, self.scratch, self.head_dim, plan.heads_per_pass, plan.grid, plan.smem_bytes,
            self.tp_world, self.fp8_weights, self.burst_counts, self.moe,
        )  # fmt: skip

    @property
    def logical_vocab(self) -> int:
        return self.logits_scratch.numel()

    def step(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        logits_out: torch.Tensor | None = None,
        tokens_out: torch.Tensor | None = None,
        model_table: torch.Tensor | None = None,
        num_out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decode step: appends this position's K/V to every layer's cache, returns the greedy token as an
        int64 [1] GPU tensor (a fresh tensor unless `tokens_out` is given); if `logits_out` (bf16 [vocab]) is given
        it receives the logical-vocabulary logits; if `num_out` (int32 [1] GPU) is given it receives 1, or 0 when
        the launch aborted (status_word). No host synchronisation."""
        if logits_out is not None and logits_out.numel() < self.logical_vocab:
            raise ValueError(f"logits_out has {logits_out.numel()} elements for a vocabulary of {self.logical_vocab}")
        if tokens_out is None:
            tokens_out = torch.empty(1, dtype=torch.int64, device=self.device)
        self.ops.monokernel_step(
            self.launch, input_ids, positions, block_table, slot_mapping, tokens_out, logits_out, num_out, None, 1,
            model_args=model_table,
        )  # fmt: skip
        return tokens_out

    def generate(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        block_table: torch.Tensor,
        slot_mapping: torch.Tensor,
        num_tokens: int,
        stop_ids: torch.Tensor | None = None,
        logits_out: torch.Tensor | None = None,
        sample_seed: torch.Tensor | None = None,
        temperature: float = 0.0,
        model_table: torch.Tensor | None = None,
        launch_gate: torch.Tensor | None = None,
        gate_min: int = 0,
        cancel: torch.Tensor | None = None,
        cancel_id: int = 0,
        top_k: int = 0,
        top_p: float = 1.0,
        min_p: float = 0.0,
        defer_out: torch.Tensor | None = None,
        prompt_mask: torch.Tensor | None = None,
        output_counts: torch.Tensor | None = None,
        repetition_penalty: float = 1.0,
        frequency_penalty: float = 0.0,
        presence_penalty: float = 0.0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to num_tokens tokens in one launch, each fed back as the next position's input (positions
        p, p + 1, ...; slots from block_table beyond the first). Stops after a token in stop_ids (int64 GPU).
        Greedy, or with sample_seed (int64 [1] GPU: the request's vLLM sampling seed) and temperature > 0 the
        token vLLM's sampler draws with that temperature (kog_backend.reference.sampling, keyed by the seed and each token's
        input position; fp32 Gumbel noise), after vLLM's top_k (0: off), top_p (1: off) and min_p (0: off) as its
        SamplingStates holds them. With any of those three the launch may end before a token whose draw depends on
        vLLM's own fp32 rounding (csrc/include/kog/burst_sampling.cuh): defer_out (int32 [1] GPU, zero before the
        launch) is then 1 and count excludes that token, whose logits are in logits_out's row `count` (or in
        logits_scratch without logits_out).
        Returns (tokens int64 [num_tokens], count int32 [1]); entries past count are unspecified.
        model_table: a variant_table for benchmarks (default: this model's table).
        Run-ahead launches (kog_backend.path.run_ahead; one GPU only): with launch_gate (int32 [1] GPU, written earlier on
        the stream) the launch does nothing, count 0, unless launch_gate[0] >= gate_min; with cancel (pinned CPU
        int64 [1]) it ends after the token in hand once cancel[0] >= cancel_id, that token stored as -1 - id.
        Penalties (csrc/include/kog/penalties.cuh; one GPU only, with sample_seed; temperature 0 is then vLLM's
        argmax after them): vLLM's repetition/frequency/presence penalty applied to every token's logits with
        prompt_mask (int32 [ceil(V / 32)]) and output_counts (int32 [V]), the request's rows of vLLM's
        PenaltiesState as of the launch; the launch's own tokens count too. The logits it leaves are penalised."""
        if logits_out is not None and (logits_out.dim() != 2 or logits_out.shape[0] < num_tokens
                                       or logits_out.shape[1] < self.logical_vocab):
            raise ValueError(f"logits_out must be [>= {num_tokens}, >= {self.logical_vocab}]")
        penalized = repetition_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0
        if sample_seed is not None and not (temperature > 0.0 or (penalized and temperature == 0.0)):
            raise ValueError(f"a sampled launch needs temperature > 0 (0 with penalties), got {temperature}")
        if penalized:
            if self.burst_counts is None:
                raise ValueError("penalties in a launch: not under tensor parallelism")
            if sample_seed is None or prompt_mask is None or output_counts is None:
                raise ValueError("a launch with penalties needs sample_seed, prompt_mask and output_counts")
            if output_counts.numel() < self.logical_vocab or prompt_mask.numel() * 32 < self.logical_vocab:
                raise ValueError(f"penalty rows cover {output_counts.numel()} / {prompt_mask.numel() * 32} of "
                                 f"{self.logical_vocab} vocabulary ids")
        if top_k > 0 or top_p < 1.0 or min_p > 0.0:
            reason = self.filtered_sampling_reason
            if reason is not None:
                raise ValueError(reason)
            if sample_seed is None or defer_out is None:
                raise ValueError("a launch with top_k / top_p / min_p needs sample_seed and defer_out")
        classes = self._classes
        sampling = None
        if sample_seed is not None:  # a fresh seed tensor per call (the runner's), so one object per launch
            sampling = classes.SampledLaunch(
                sample_seed, float(temperature), int(top_k), float(top_p), float(min_p), defer_out, prompt_mask,
                output_counts, float(repetition_penalty), float(frequency_penalty), float(presence_penalty),
            )  # fmt: skip
        run_ahead = None
        if launch_gate is not None or cancel is not None:
            run_ahead = classes.RunAheadLaunch(launch_gate, int(gate_min), cancel, int(cancel_id))
        tokens = torch.empty(num_tokens, dtype=torch.int64, device=self.device)
        count = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.ops.monokernel_step(
            self.launch, input_ids, positions, block_table, slot_mapping, tokens, logits_out, count, stop_ids,
            num_tokens, sampling, run_ahead, model_table,
        )  # fmt: skip
        return tokens, count

    @property
    def filtered_sampling_reason(self) -> str | None:
        """None when launches may draw with top-k / top-p / min-p (burst_sampling.cuh), else the gate's reason."""
        return gate.filtered_sampling_reason(self.plan, tensor_parallel=self.sample_work is None)

    @property
    def penalty_reason(self) -> str | None:
        """None when launches may apply vLLM's penalties (penalties.cuh), else the gate's reason."""
        return gate.penalty_reason(tensor_parallel=self.burst_counts is None)

    def table_value(self, name: str, **overrides) -> int | float:
        """ModelArgs field `name` of the default table (or of one with these overrides)."""
        return overrides.get(name, self._model_values[name])

    def attention_splits(self, ctx: int, **overrides) -> int:
        """Attention splits per KV head the kernel takes at context length ctx with the default table (or one with
        these overrides): 1 up to attn_single_ctx, else plan.num_splits."""
        single = int(self.table_value("attn_single_ctx", **overrides))
        return 1 if ctx <= single else self.plan.num_splits

    def variant_table(self, **overrides) -> torch.Tensor:
        """A copy of the argument table with some ModelArgs fields replaced (benchmarks time variants with it:
        fewer layers, a smaller LM head, a shallower ring). Use it only through step(model_table=...)."""
        values = dict(self._model_values)
        for k, v in overrides.items():
            if k not in values:
                raise KeyError(k)
            values[k] = v
        return _to_device(layout.pack_model(values), self.device)

    def trace_table(self, num_tokens: int = 1, **overrides) -> tuple[torch.Tensor, torch.Tensor]:
        """(argument table, timeline) for launches of up to num_tokens tokens that record when each block passed
        each point of the schedule (csrc/include/kog/trace.cuh): timeline is int64 [num_tokens, num_layers + 1,
        kTraceEvents, grid] of %globaltimer ns, 0 where a block skipped a point. Diagnostics only."""
        L = int(overrides.get("num_layers", self.shape.num_layers))
        trace = torch.zeros(num_tokens, L + 1, layout.CONFIG["kTraceEvents"], self.plan.grid, dtype=torch.int64,
                            device=self.device)  # fmt: skip
        table = self.variant_table(trace=trace.data_ptr(), **overrides)
        return table, trace

    def residency_reason(self, tp: bool) -> str | None:
        """None when the device holds every block of this plan's grid at once (each kernel variant the runner may
        launch: greedy and sampled), else why not: the kernel's blocks wait for each other, so a grid that is not
        all resident would hang (the kernel would abort it after ~1 ms, sync.cuh; this refuses it up front)."""
        if not kog_ops.has_op("monokernel_max_grid"):
            return None
        for sampled in (False, True):
            held = int(self.ops.monokernel_max_grid(self.head_dim, self.plan.heads_per_pass, sampled, tp,
                                                    self.plan.smem_bytes, self.device.index or 0,
                                                    self.fp8_weights, self.moe))  # fmt: skip
            reason = gate.residency_reason(held, self.plan.grid)
            if reason is not None:
                return reason
        return None

    def status_word(self) -> int:
        """The abort word of the last launch that ran (0: it completed; else the kSite* of the first wait that gave
        up, sync.cuh). A host read of pinned memory, no device call: valid once that launch is done (an event or a
        synchronisation behind it on the stream, such as vLLM's wait for the step's output)."""
        return int(self.status[0])

    def fault_table(self) -> torch.Tensor:
        """A copy of the argument table whose launches abort (ModelArgs::inject_fault: one wait never completes).
        Fault tests only; use it through step / generate(model_table=...)."""
        return self.variant_table(inject_fault=1)

    def _read_counters(self) -> torch.Tensor:
        if self._tp_buffer is None:
            return self.counters
        torch.cuda.synchronize(self.device)
        out = torch.empty_like(self.counters)
        self.ops.ipc_copy(out.data_ptr(), self._counters_ptr, out.numel() * 4, self.device.index)
        return out

    def reset_counters(self) -> None:
        """Zeroes the dependency counters (after a launch that did not run to completion or aborted). Under tensor
        parallelism every rank must do it, with no launch of any rank in flight."""
        self.counters.zero_()
        self.act_tagged.zero_()
        if self.sample_work is not None:
            self.sample_work.zero_()
        if self.burst_counts is not None:
            self.burst_counts.zero_()
        self.status.zero_()
        if self._tp_buffer is not None:
            torch.cuda.synchronize(self.device)
            nbytes = self.counters.numel() * 4
            self.ops.ipc_copy(self._counters_ptr, self.counters.data_ptr(), nbytes, self.device.index)
            torch.cuda.synchronize(self.device)

    def diagnostics(self) -> str | None:
        """None if no wait of any launch so far timed out; else which one (synchronises with the device)."""
        c = self._read_counters().view(-1, layout.CONFIG["kCounterStride"])[:, 0].tolist()
        site = c[ABORT]
        if site == 0:
            return None
        block, what, target, seen = (x & 0xFFFFFFFF for x in c[ABORT + 1 : ABORT + 5])
        moe_base = self._model_values["moe_ctr_base"] if self.moe else None
        return describe_abort(site, block, what, target, seen, self.shape.num_kv_heads, moe_base)


ABORT = 4  # kCtrAbort (sync.cuh); kCtrDiag = ABORT + 1 .. ABORT + 4
SITE_NOT_RESIDENT = 7  # kSiteNotResident (sync.cuh)
ABORT_SITES = {1: "counter", 2: "weight slot full", 3: "weight slot empty (loader)", 4: "next-token go (loader)",
               5: "hand-off hold (loader)", 6: "tagged hand-off", SITE_NOT_RESIDENT: "blocks not resident"}


def describe_abort(site: int, block: int, what: int, target: int, seen: int, num_kv_heads: int,
                   moe_ctr_base: int | None = None) -> str:
    """The diagnostic of an aborted launch from its abort word (site) and the four words after it (sync.cuh);
    moe_ctr_base: ModelArgs::moe_ctr_base of a MoE table."""
    if site == SITE_NOT_RESIDENT:
        on = "tagged words" if what == 0xFFFFFFFF else \
            f"counter {what} ({describe_counter(what, num_kv_heads, moe_ctr_base)})"
        return f"blocks not resident: block {block} waited over 1 ms on {on} with {seen} of {target} blocks started"
    desc = f"{ABORT_SITES.get(site, site)} wait timed out in block {block}: what={what} target={target} seen={seen}"
    if site == 1:
        desc += f" ({describe_counter(what, num_kv_heads, moe_ctr_base)})"
    return desc


def describe_counter(index: int, num_kv_heads: int, moe_ctr_base: int | None = None) -> str:
    """The counter at `index` (in counters of kCounterStride words): a global one, a layer's stage or attention
    split counter, or (from moe_ctr_base in a MoE table) a layer's router chunks or its published route."""
    names = {0: "epoch", 1: "finish", 2: "lm", 3: "token-ready", 9: "tp-lm", 10: "sample-arrive", 11: "sample-ready",
             12: "started"}
    base = layout.CONFIG["kCtrLayerBase"]
    if index < base:
        return names.get(index, f"global {index}")
    if moe_ctr_base is not None and index >= moe_ctr_base:
        layer, which = divmod(index - moe_ctr_base, 2)
        return f"layer {layer} " + ("router" if which == 0 else "route")
    layer, which = divmod(index - base, layout.CONFIG["layer_counter_count_0"] + num_kv_heads)
    kinds = ("qkv", "o", "gate_up", "down", "attn_done")
    return f"layer {layer} " + (kinds[which] if which < len(kinds) else f"attn split counter of kv head {which - 5}")


def _round8(n: int) -> int:
    return (n + 7) // 8 * 8


def _to_device(buf: bytes, device: torch.device) -> torch.Tensor:
    return torch.frombuffer(bytearray(buf), dtype=torch.uint8).to(device)
