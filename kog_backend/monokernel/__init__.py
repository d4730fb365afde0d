"""The persistent decode monokernel: `Monokernel` (one launch per step on vLLM's own weights and KV cache) and
`unsupported_reason` (the gate's reason a model/GPU cannot use it,
kog_backend.path.gate.monokernel). Device code: csrc/include/kog/; design: docs/monokernel.md."""

from kog_backend.monokernel.host import Monokernel, unsupported_reason

__all__ = ["Monokernel", "unsupported_reason"]
