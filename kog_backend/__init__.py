"""kog_backend: single-request decode backend for vLLM 0.26.

Importing this package imports neither torch nor vLLM; the plugin entry points in
`kog_backend.engine.plugin` import what they need lazily.
"""

__version__ = "0.1.0"

# The vLLM release whose internals (V2 model runner, KV-cache layout, sampler states) kog is built on.
SUPPORTED_VLLM = "0.26"
