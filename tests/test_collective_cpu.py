"""CPU tests of the collective: constants mirrored from the header, buffer layout, epoch arithmetic, the
protocol model (including the protocol broken on purpose), dispatch thresholds and fallback decisions."""

from __future__ import annotations

import os
import random
import re
import types

import pytest
import torch

from kog_backend.collective import dispatch, groupcomm, layout, p2p_check
from kog_backend.collective import reference as R

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER = os.path.join(ROOT, "csrc", "include", "kog", "allreduce.cuh")


def _camel_to_upper(name: str) -> str:
    """kLLPackBytes -> LL_PACK_BYTES; "OneShot"/"TwoShot" are spelled ONESHOT/TWOSHOT in Python."""
    name = name.replace("OneShot", "Oneshot").replace("TwoShot", "Twoshot")
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).upper()


def _header_constants() -> dict[str, int]:
    with open(HEADER) as f:
        text = f.read()
    return {_camel_to_upper(m.group(1)): int(m.group(2))
            for m in re.finditer(r"^constexpr int k(\w+) = (\d+);", text, re.MULTILINE)}


# ---------------------------------------------------------------- constants and layout


def test_every_header_constant_is_mirrored():
    consts = _header_constants()
    assert len(consts) == 24, consts  # every namespace-scope constant of the header
    for name, value in consts.items():
        assert getattr(layout, name) == value, name


def test_layout_regions_are_disjoint_aligned_and_in_bounds():
    for world in layout.SUPPORTED_WORLD_SIZES:
        for one, two in ((0, 0), (16, 16 * world), (4096, 16 * world * 3), (256 * 1024, 1024 * 1024 // (16 * world)
                                                                                * 16 * world)):
            L = layout.make_layout(world, one, two)
            spans = [(0, world * layout.CHECK_SLOT_BYTES)]
            for s in range(layout.NUM_SETS):
                for r in range(world):
                    spans.append((L.oneshot_slot_off(s, r), L.oneshot_cap_packs * layout.LL_PACK_BYTES))
                    spans.append((L.rs_slot_off(s, r), L.chunk_cap_packs * layout.LL_PACK_BYTES))
                    spans.append((L.ag_slot_off(s, r), L.chunk_cap_packs * layout.LL_PACK_BYTES))
            spans = sorted((a, a + n) for a, n in spans if n)
            for (a0, a1), (b0, _) in zip(spans, spans[1:]):
                assert a1 <= b0, (world, one, two, a0, a1, b0)
            assert spans[-1][1] <= L.total
            for a, _ in spans[1:]:
                assert a % layout.ALIGN == 0
            assert L.oneshot_cap_packs * layout.PACK_BYTES == one
            assert L.chunk_cap_packs * layout.PACK_BYTES * world == two
            assert L.total >= layout.HEADER_BYTES + layout.NUM_SETS * 2 * (one + 2 * two)


def test_layout_rejects_bad_capacities():
    with pytest.raises(ValueError):
        layout.make_layout(4, 24, 0)
    with pytest.raises(ValueError):
        layout.make_layout(4, 16, 16 * 3)
    with pytest.raises(ValueError):
        layout.make_layout(9, 16, 0)


def _load_ext():
    from kog_backend.collective import _ext

    if _ext.extension_path() is None:
        pytest.skip("kog_backend._C not built")
    try:
        return _ext.load_ops()
    except (ImportError, OSError) as e:
        pytest.skip(f"extension does not load here: {e}")


def test_cpp_layout_and_constants_match_python():
    ops = _load_ext()
    c = ops.allreduce_constants()
    assert c == [layout.MAX_WORLD, layout.THREADS, layout.MAX_BLOCKS, layout.PACK_BYTES, layout.LL_PACK_BYTES,
                 layout.NUM_SETS, layout.HEADER_BYTES, layout.CHECK_SLOT_BYTES, layout.ALIGN, layout.ERR_WORDS,
                 layout.DEFAULT_REFRESH_LOG2]
    rng = random.Random(0)
    for _ in range(50):
        world = rng.choice(layout.SUPPORTED_WORLD_SIZES)
        one = 16 * rng.randint(0, 20000)
        two = 16 * world * rng.randint(0, 5000)
        assert ops.allreduce_layout(world, one, two) == layout.make_layout(world, one, two).as_list()
    with pytest.raises(RuntimeError):
        ops.allreduce_layout(4, 16, 16 * 3)


def test_grid_gives_every_block_work():
    for work in list(range(600)) + [10**5, 10**6]:
        g = layout.grid_for(work)
        assert 1 <= g <= layout.MAX_BLOCKS
        if work > 0:
            assert (g - 1) * layout.THREADS < work  # the last block's first thread has a pack


# ---------------------------------------------------------------- epochs


def test_epoch_sequence_wraps_skipping_zero_and_one_with_alternating_parity():
    e = layout.EPOCH_MAX - 3
    seq = []
    for _ in range(8):
        e = layout.next_epoch(e)
        seq.append(e)
    assert seq == [layout.EPOCH_MAX - 2, layout.EPOCH_MAX - 1, layout.EPOCH_MAX, 2, 3, 4, 5, 6]
    assert layout.next_epoch(0) == 1
    sets = [layout.set_of(x) for x in [layout.EPOCH_MAX - 3] + seq]
    assert all(a != b for a, b in zip(sets, sets[1:]))


def test_refresh_epochs_hit_both_sets_every_period():
    for log2 in (1, 2, 5, 20):
        mask = layout.refresh_mask(log2)
        period = mask + 1
        for start in (1, 2, 12345, layout.EPOCH_MAX - period - 3):
            e, seen = start, set()
            for _ in range(period + 2):
                e = layout.next_epoch(e)
                if layout.is_refresh_epoch(e, mask):
                    seen.add(layout.set_of(e))
            assert seen == {0, 1}, (log2, start)
    with pytest.raises(ValueError):
        layout.refresh_mask(0)


# ---------------------------------------------------------------- protocol model


def _check(calls, outputs, world):
    for c, call in enumerate(calls):
        want = call.expected()
        for r in range(world):
            assert outputs[c][r] == want, f"call {c} rank {r}"


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("seed", range(3))
def test_model_random_sequences_are_exact(world, seed):
    cfg = R.ModelConfig(world=world, refresh_log2=2)  # refresh every 4 calls: exercised here
    calls = R.random_calls(world, 30, cfg, seed=seed)
    for policy in ("random", "rank_priority"):
        _check(calls, R.Model(cfg).run(calls, seed=seed, policy=policy), world)


def test_model_crosses_the_epoch_wrap():
    cfg = R.ModelConfig(world=2, initial_epoch=layout.EPOCH_MAX - 6)
    calls = R.random_calls(2, 16, cfg, seed=7)
    _check(calls, R.Model(cfg).run(calls, seed=7), 2)


def test_model_one_slot_set_breaks():
    """Negative control: with a single set a rank overwrites data its peer has not read yet."""
    cfg = R.ModelConfig(world=2, num_sets=1)
    calls = R.random_calls(2, 30, cfg, seed=1)
    failures = 0
    for seed in range(4):
        try:
            outputs = R.Model(cfg).run(calls, seed=seed)
            _check(calls, outputs, 2)
        except (R.ProtocolHang, AssertionError):
            failures += 1
    assert failures == 4


def _stale_epoch_calls(cfg: R.ModelConfig) -> list[R.Call]:
    """A full-size call at epoch 2, small calls through one whole epoch cycle, then a full-size call that
    gets epoch 2 again (same set): without a refresh its slots still hold epoch-2 words from the first."""
    rng = random.Random(3)
    big = cfg.oneshot_cap // layout.PACK_BYTES
    cycle = cfg.epoch_max - 1  # epochs 2..epoch_max
    calls = [R.make_call(0, 1, 2, rng), R.make_call(0, big, 2, rng)]  # epochs 1, 2
    calls += [R.make_call(0, 1, 2, rng) for _ in range(cycle - 1)]
    calls.append(R.make_call(0, big, 2, rng))
    return calls


def test_model_without_refresh_accepts_stale_data_after_a_wrap():
    cfg = R.ModelConfig(world=2, epoch_max=15, refresh_log2=None)
    calls = _stale_epoch_calls(cfg)
    with pytest.raises(AssertionError, match=f"call {len(calls) - 1} rank 0"):
        _check(calls, R.Model(cfg).run(calls, policy="rank_priority"), 2)


def test_model_refresh_prevents_stale_data_after_a_wrap():
    cfg = R.ModelConfig(world=2, epoch_max=15, refresh_log2=2)
    calls = _stale_epoch_calls(cfg)
    for policy, seed in (("rank_priority", 0), ("random", 1), ("random", 2)):
        _check(calls, R.Model(cfg).run(calls, seed=seed, policy=policy), 2)


# ---------------------------------------------------------------- dispatch and fallback decisions


def test_default_thresholds_and_env_overrides():
    th = dispatch.Thresholds.for_world(8, env={})
    assert (th.oneshot_max, th.twoshot_max) == (64 * 1024, 1024 * 1024)
    th = dispatch.Thresholds.for_world(6, env={"KOG_AR_ONESHOT_MAX": "1000", "KOG_AR_TWOSHOT_MAX": "100000"})
    assert th.oneshot_max == 992 and th.twoshot_max == 100000 // 96 * 96
    for w in layout.SUPPORTED_WORLD_SIZES:
        th = dispatch.Thresholds.for_world(w, env={})
        layout.validate_caps(w, th.oneshot_max, th.twoshot_max)


def test_choose_algo_boundaries():
    th = dispatch.Thresholds(oneshot_max=64 * 1024, twoshot_max=1024 * 1024)
    assert dispatch.choose_algo(16, 4, th) == (layout.ALGO_ONESHOT, None)
    assert dispatch.choose_algo(64 * 1024, 4, th) == (layout.ALGO_ONESHOT, None)
    assert dispatch.choose_algo(64 * 1024 + 64, 4, th) == (layout.ALGO_TWOSHOT, None)
    assert dispatch.choose_algo(1024 * 1024, 4, th) == (layout.ALGO_TWOSHOT, None)
    algo, why = dispatch.choose_algo(64 * 1024 + 16, 4, th)
    assert algo is None and "16*world" in why
    algo, why = dispatch.choose_algo(1024 * 1024 + 64, 4, th)
    assert algo is None and "NCCL" in why
    assert dispatch.choose_algo(24, 4, th)[0] is None
    assert dispatch.choose_algo(0, 4, th)[0] is None


class _FakeCuda:
    """What dispatch.should_use reads from a tensor, for a CUDA tensor on a CPU-only machine."""

    def __init__(self, shape, dtype=torch.bfloat16, device="cuda:0", contiguous=True, ptr=4096):
        self.shape, self.dtype, self.device = tuple(shape), dtype, torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self._contig, self._ptr = contiguous, ptr

    def dim(self):
        return len(self.shape)

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n

    def element_size(self):
        return torch.empty(0, dtype=self.dtype).element_size()

    def is_contiguous(self):
        return self._contig

    def data_ptr(self):
        return self._ptr


def test_should_use_reasons():
    dev = torch.device("cuda:0")
    th = dispatch.Thresholds(oneshot_max=64 * 1024, twoshot_max=1024 * 1024, max_tokens=1)
    use = lambda t, **kw: dispatch.should_use(t, world=2, device=dev, th=th, **kw)
    assert use(_FakeCuda((1, 2048))) == (layout.ALGO_ONESHOT, None)
    assert use(_FakeCuda((1, 2048 * 64))) == (layout.ALGO_TWOSHOT, None)
    cases = {
        "batched step": _FakeCuda((4, 2048)),
        "dtype": _FakeCuda((1, 2048), dtype=torch.float64),
        "on cuda:1": _FakeCuda((1, 2048), device="cuda:1"),
        "not contiguous": _FakeCuda((1, 2048), contiguous=False),
        "aligned": _FakeCuda((1, 2048), ptr=4098),
        "multiple of 16": _FakeCuda((1, 7)),
        "exceeds": _FakeCuda((1, 1024 * 1024)),
    }
    for fragment, t in cases.items():
        algo, why = use(t)
        assert algo is None and fragment in why, (fragment, why)
    algo, why = use(_FakeCuda((1, 2048)), disabled_reason="P2P check failed")
    assert algo is None and "P2P check failed" in why
    assert use(torch.zeros(1, 2048, dtype=torch.bfloat16))[0] is None  # a CPU tensor


def test_static_disable_reasons():
    assert dispatch.static_disable_reason(2, env={}) is None
    assert "world size 1" in dispatch.static_disable_reason(1, env={})
    assert "not in" in dispatch.static_disable_reason(3, env={})
    assert "KOG_AR_DISABLE" in dispatch.static_disable_reason(4, env={"KOG_AR_DISABLE": "1"})


# ---------------------------------------------------------------- start-up check and shared verdicts


def test_check_pattern_detects_every_kind_of_wrong_area():
    world, rank = 4, 2
    area = bytearray(world * layout.CHECK_SLOT_BYTES)
    for src in range(world):
        if src != rank:
            off = src * layout.CHECK_SLOT_BYTES
            area[off:off + layout.CHECK_SLOT_BYTES] = p2p_check.check_pattern(src, rank)
    assert p2p_check.verify_check_area(bytes(area), rank, world) is None
    zeroed = bytearray(area)
    zeroed[0:layout.CHECK_SLOT_BYTES] = bytes(layout.CHECK_SLOT_BYTES)  # rank 0 never wrote
    assert "rank 0" in p2p_check.verify_check_area(bytes(zeroed), rank, world)
    swapped = bytearray(area)
    swapped[layout.CHECK_SLOT_BYTES:2 * layout.CHECK_SLOT_BYTES] = p2p_check.check_pattern(1, 3)  # wrong dst
    assert "rank 1" in p2p_check.verify_check_area(bytes(swapped), rank, world)
    flipped = bytearray(area)
    flipped[3 * layout.CHECK_SLOT_BYTES + 17] ^= 0x10
    assert "1/256 bytes from rank 3" in p2p_check.verify_check_area(bytes(flipped), rank, world)
    pats = {p2p_check.check_pattern(s, d) for s in range(8) for d in range(8) if s != d}
    assert len(pats) == 56 and bytes(layout.CHECK_SLOT_BYTES) not in pats


def test_reason_encoding_round_trip():
    for reason in (None, "", "x", "é" * 10, "r" * 1000):
        got = groupcomm.decode_reason(groupcomm.encode_reason(reason))
        if reason is None:
            assert got is None
        else:
            assert reason.encode()[:groupcomm.REASON_BYTES].decode("utf-8", "replace") == got
    assert groupcomm.combine_reasons([None, None]) is None
    assert groupcomm.combine_reasons([None, "boom", None, "bang"]) == "rank 1: boom; rank 3: bang"


class _FakeIpcOps:
    """ipc_* ops without a GPU; `fail_open_on` ranks raise like a failing cudaIpcOpenMemHandle."""

    def __init__(self, rank, fail_open_on=()):
        self.rank, self.fail_open_on, self.freed, self.closed = rank, fail_open_on, [], []

    def ipc_alloc(self, nbytes, device):
        return (self.rank + 1) << 20

    def ipc_get_handle(self, ptr, device):
        return [(ptr >> 20) + i for i in range(64)]

    def ipc_open(self, handle, device):
        if self.rank in self.fail_open_on:
            raise RuntimeError("cudaIpcOpenMemHandle failed: invalid argument")
        return (100 + handle[0]) << 20

    def ipc_close(self, ptr, device):
        self.closed.append(ptr)

    def ipc_free(self, ptr, device):
        self.freed.append(ptr)


def _shared_buffer_worker(rank, world, init_file, fail_open_on, out_dir):
    import json

    import torch.distributed as dist

    from kog_backend.collective.ipc import SharedBuffer

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    ops = _FakeIpcOps(rank, fail_open_on)
    buf, reason = SharedBuffer.create(ops, dist.group.WORLD, 0, 1 << 16)
    result = {"reason": reason, "bases": None if buf is None else buf.bases, "freed": ops.freed,
              "closed": ops.closed}
    if buf is not None:
        buf.close(group=dist.group.WORLD)
        result["freed_after_close"] = ops.freed
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.destroy_process_group()


@pytest.mark.parametrize("fail_open_on", [(), (1,)])
def test_shared_buffer_verdict_is_shared(tmp_path, fail_open_on):
    import json

    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_shared_buffer_worker, args=(world, str(tmp_path / "init"), fail_open_on, str(tmp_path)),
             nprocs=world, join=True)
    res = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(world)]
    if not fail_open_on:
        for r in range(world):
            assert res[r]["reason"] is None
            want = [(100 + s + 1) << 20 if s != r else (r + 1) << 20 for s in range(world)]
            assert res[r]["bases"] == want
            assert res[r]["freed_after_close"] == [(r + 1) << 20]
    else:
        for r in range(world):
            assert res[r]["bases"] is None
            assert res[r]["reason"].startswith("rank 1: cudaIpcOpenMemHandle")
            assert res[r]["freed"] == [(r + 1) << 20]  # every rank freed its own buffer after the verdict


def test_allreduce_world_one_is_disabled_without_collectives(tmp_path):
    import torch.distributed as dist

    from kog_backend.collective.allreduce import KogAllReduce

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'init'}", rank=0, world_size=1)
    try:
        ar = KogAllReduce(dist.group.WORLD, "cuda:0")
        assert ar.disabled and ar.disabled_reason == "world size 1"
        assert "world size 1" in ar.should_use(_FakeCuda((1, 2048)))
        with pytest.raises(ValueError, match="world size 1"):
            ar.all_reduce(_FakeCuda((1, 2048)))
        ar.close()
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------- vLLM communicator routing


def test_communicator_routes_by_reason(monkeypatch):
    cc = pytest.importorskip("vllm.distributed.device_communicators.cuda_communicator")
    from kog_backend.collective import communicator as kc

    stock = []
    monkeypatch.setattr(cc.CudaCommunicator, "all_reduce", lambda self, x: stock.append(x) or "stock")

    class _Kog:
        def __init__(self):
            self.calls = []

        def choose(self, t):
            return (0, None) if t.shape[0] == 1 else (None, "batched step")

        def all_reduce(self, t, algo=None):
            self.calls.append((t, algo))
            return "kog"

    comm = object.__new__(kc.KogCommunicator)
    comm.kog_ar, comm.kog_active, comm.kog_calls = _Kog(), True, 0
    comm.kog_fallbacks = __import__("collections").Counter()
    one, many = types.SimpleNamespace(shape=(1, 8)), types.SimpleNamespace(shape=(4, 8))
    assert comm.all_reduce(one) == "kog" and comm.kog_calls == 1
    assert comm.all_reduce(many) == "stock" and comm.kog_fallbacks == {"batched step": 1}
    comm.set_kog_active(False)
    assert comm.all_reduce(one) == "stock" and comm.kog_calls == 1
    comm.kog_ar = None
    comm.set_kog_active(True)
    assert comm.all_reduce(one) == "stock"
    assert kc.COMMUNICATOR_QUALNAME == "kog_backend.collective.communicator.KogCommunicator"
    assert kc._max_tokens_from_config() == 1


def _fake_mps_control(tmp_path, monkeypatch, on_start: str):
    """Puts a fake nvidia-cuda-mps-control first on PATH: `-d` appends "start" to tmp_path/calls and runs on_start
    (shell); any other call reads one command from stdin, appends it, and marks tmp_path/quit. Returns the calls file."""
    from kog_backend.collective import testing

    calls = tmp_path / "calls"
    fake = tmp_path / "nvidia-cuda-mps-control"
    fake.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = "-d" ]; then echo start >> {calls}; {on_start}; fi\n'
        f"read cmd; echo $cmd >> {calls}; touch {tmp_path}/quit\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setattr(testing.time, "sleep", lambda s: None)
    return calls


_ALREADY = 'echo "An instance of this daemon is already running" >&2; exit 1'


def test_mps_quits_a_leftover_daemon_and_retries(tmp_path, monkeypatch):
    """A daemon left on the private root by a killed run ("already running"): mps() sends it `quit` and starts
    again, instead of refusing to share the GPU."""
    from kog_backend.collective import testing

    calls = _fake_mps_control(tmp_path, monkeypatch, f"if [ ! -f {tmp_path}/quit ]; then {_ALREADY}; fi; exit 0")
    monkeypatch.setattr(testing.sys, "executable", "/bin/false")  # the client probe fails: no GPU here
    with testing.mps(root=str(tmp_path / "mps")) as status:
        assert status.startswith("no-mps: a client could not use the daemon"), status
    assert calls.read_text().split() == ["start", "quit", "start", "quit"]


def test_mps_gives_up_on_a_daemon_that_never_goes(tmp_path, monkeypatch):
    """A daemon that keeps answering "already running": a bounded number of quit-and-retry rounds, then no MPS with
    the daemon's message (the GPU tests then skip or run their ranks time-sliced, never hang)."""
    from kog_backend.collective import testing

    calls = _fake_mps_control(tmp_path, monkeypatch, _ALREADY)
    with testing.mps(root=str(tmp_path / "mps")) as status:
        assert status.startswith("no-mps: daemon did not start: An instance"), status
    words = calls.read_text().split()
    assert words.count("start") == 11 and words.count("quit") == 10
