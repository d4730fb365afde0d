"""What plugs into vLLM's engine: the plugin entry points and --backend flags, the worker, scheduler and
model runner that route each step, the kog step the runner delegates to (monokernel_step, torch_step,
launch_outcome, step_select), and the registry of vLLM patches."""
