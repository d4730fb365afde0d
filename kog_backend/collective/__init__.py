"""kog's low-latency all-reduce between the GPUs of one node (CUDA IPC buffers, self-signalling data).

Modules (importing this package imports neither torch nor vLLM):
  layout       protocol constants, buffer layout, epoch arithmetic (mirror of csrc/include/kog/allreduce.cuh)
  dispatch     one-shot / two-shot / stock decision: `should_use`-style gates that return reasons
  reference    pure-Python model of the protocol (the kernels' schedule), used by the CPU tests
  groupcomm    tensor-only collectives over a gloo group (handle exchange, shared verdicts)
  ipc          SharedBuffer: one buffer per rank, shared through CUDA IPC
  p2p_check    the start-up write/read round trip
  allreduce    KogAllReduce: the communicator object (set-up, calls, timeout errors, close)
  communicator KogCommunicator(CudaCommunicator) for vLLM's stock path (imports vLLM)
  testing      multi-process harness and CUDA MPS helper for the GPU tests and the benchmark
docs/collective.md describes the protocol.
"""

COMMUNICATOR_QUALNAME = "kog_backend.collective.communicator.KogCommunicator"
