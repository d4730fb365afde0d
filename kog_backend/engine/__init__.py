"""What plugs into vLLM's engine: the plugin entry points and --backend flags, the worker, scheduler and
model runner that route each step, and the registry of vLLM patches."""
