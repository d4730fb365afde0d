"""`kog doctor`: can kog run here, and what will run on the kog path.

  probe     reads the environment (torch, NVML, entry points, environment variables); the one place tests fake
  checks    turns what the probe saw into Check results (pure)
  features  what runs on the kog path and what falls back, from the gate (kog_backend.path.gate)
  report    prints them; exit status 0 when kog would run, 1 when it would not
"""
