"""`kog doctor` on faked machines (no GPU, another vLLM, a non-Hopper GPU, failing P2P, ...) and, for real,
on this machine."""

from __future__ import annotations

import argparse
import json

import pytest

from kog_backend.path import eligibility
from kog_backend.tools.commands import doctor as doctor_cmd
from kog_backend.tools.doctor import checks, features, report
from kog_backend.tools.doctor.probe import GpuInfo, P2PResult, Probe

H200 = GpuInfo(0, "NVIDIA H200", (9, 0), 139.8)


class FakeProbe(Probe):
    """A healthy H200 machine unless told otherwise."""

    def __init__(self, **kw):
        self.versions = {"kog-backend": "0.1.0", "vllm": "0.26.0", "nvidia-nccl-cu13": "2.28.9"}
        self.versions.update(kw.pop("versions", {}))
        self.entry_points = {"vllm.general_plugins": ["kog"], "vllm.platform_plugins": ["kog"], "vllm.logits_processors": []}
        self.entry_points.update(kw.pop("entry_points", {}))
        self.environ = kw.pop("environ", {})
        self._torch = kw.pop("torch", "2.11.0+cu130")
        self._gpus = kw.pop("gpus", [H200])
        self._driver = kw.pop("driver", ("580.159.03", 13000))
        self._ext = kw.pop("ext", (True, "/site/kog_backend/_C.abi3.so"))
        self._p2p = kw.pop("p2p", lambda s, d: P2PResult(s, d, True, True, 50.0))
        self.p2p_calls = []
        assert not kw, kw

    def package_version(self, dist):
        return self.versions.get(dist)

    def entry_point_names(self, group):
        return self.entry_points.get(group, [])

    def env(self, name):
        return self.environ.get(name)

    def torch_version(self):
        return self._torch

    def torch_cuda_version(self):
        return "13.0" if self._torch else None

    def gpus(self):
        return self._gpus

    def driver(self):
        return self._driver

    def nccl_version(self):
        return "2.28.9"

    def extension(self):
        return self._ext

    def p2p(self, src, dst):
        self.p2p_calls.append((src, dst))
        return self._p2p(src, dst)


def by_name(result):
    return {c.name: c for c in result}


def test_healthy_h200():
    res = checks.run_checks(FakeProbe())
    assert all(c.status in ("ok", "skip") for c in res), res
    assert by_name(res)["P2P"].status == "skip"  # one GPU
    assert checks.exit_status(res) == 0
    assert "kog would run here (exit 0)" in report.format_checks(res)


def test_no_gpu_reports_cleanly():
    probe = FakeProbe(gpus=[], driver=(None, None))
    res = by_name(checks.run_checks(probe))
    assert res["GPU"].status == "fail" and "no GPU" in res["GPU"].summary
    assert res["driver"].status == "skip" and res["driver"].summary == "no GPU"
    assert res["P2P"].status == "skip" and res["P2P"].summary == "no GPU"
    assert probe.p2p_calls == []
    assert checks.exit_status(list(res.values())) == 1
    assert "would NOT run" in report.format_checks(list(res.values()))


@pytest.mark.parametrize("version", ["0.25.1", "0.27.0", "1.0.0"])
def test_wrong_vllm_version(version):
    res = checks.run_checks(FakeProbe(versions={"vllm": version}))
    c = by_name(res)["vLLM"]
    assert c.status == "fail" and version in c.summary and "0.26" in c.fix
    assert checks.exit_status(res) == 1


def test_vllm_patch_release_is_fine():
    assert by_name(checks.run_checks(FakeProbe(versions={"vllm": "0.26.3"})))["vLLM"].status == "ok"


def test_vllm_missing():
    probe = FakeProbe()
    del probe.versions["vllm"]
    assert by_name(checks.run_checks(probe))["vLLM"].status == "fail"


@pytest.mark.parametrize("name,cap", [("NVIDIA A100-SXM4-80GB", (8, 0)), ("NVIDIA L40S", (8, 9)), ("NVIDIA B200", (10, 0))])
def test_non_hopper_gpu(name, cap):
    res = checks.run_checks(FakeProbe(gpus=[GpuInfo(0, name, cap, 80.0)]))
    c = by_name(res)["GPU"]
    assert c.status == "fail" and name in c.summary and f"{cap[0]}.{cap[1]}" in c.summary
    assert checks.exit_status(res) == 1


def test_mixed_gpus_fail():
    gpus = [H200, GpuInfo(1, "NVIDIA A100", (8, 0), 80.0)]
    assert by_name(checks.run_checks(FakeProbe(gpus=gpus)))["GPU"].status == "fail"


@pytest.mark.parametrize("torch_version", ["2.10.0+cu128", "2.12.0", None])
def test_wrong_torch(torch_version):
    res = checks.run_checks(FakeProbe(torch=torch_version))
    assert by_name(res)["torch"].status == "fail" and checks.exit_status(res) == 1


def test_old_driver():
    res = by_name(checks.run_checks(FakeProbe(driver=("550.54.15", 12040))))
    assert res["driver"].status == "fail" and "12.4" in res["driver"].summary and "13.0" in res["driver"].summary


def test_driver_unknown_is_a_warning():
    res = checks.run_checks(FakeProbe(driver=(None, None)))
    assert by_name(res)["driver"].status == "warn" and checks.exit_status(res) == 0


def test_extension_missing_is_a_warning():
    res = checks.run_checks(FakeProbe(ext=(False, "OSError: libkog.so: cannot open shared object file")))
    c = by_name(res)["extension"]
    assert c.status == "warn" and "serves stock" in c.summary and "cannot open" in c.summary
    assert checks.exit_status(res) == 0


def test_runner_forced_to_v1():
    res = checks.run_checks(FakeProbe(environ={"VLLM_USE_V2_MODEL_RUNNER": "0"}))
    assert by_name(res)["model runner"].status == "fail"
    res = checks.run_checks(FakeProbe(entry_points={"vllm.logits_processors": ["dummy_lp"]}))
    assert by_name(res)["model runner"].status == "fail" and "dummy_lp" in by_name(res)["model runner"].summary
    assert by_name(checks.run_checks(FakeProbe(environ={"VLLM_USE_V2_MODEL_RUNNER": "1"})))["model runner"].status == "ok"


def test_install_states():
    probe = FakeProbe()
    del probe.versions["kog-backend"]
    assert by_name(checks.run_checks(probe))["kog_backend"].status == "warn"
    c = by_name(checks.run_checks(FakeProbe(entry_points={"vllm.platform_plugins": []})))["kog_backend"]
    assert c.status == "warn" and "vllm.platform_plugins" in c.summary
    c = by_name(checks.run_checks(FakeProbe(environ={"VLLM_PLUGINS": "other"})))["kog_backend"]
    assert c.status == "warn" and "VLLM_PLUGINS" in c.summary
    assert by_name(checks.run_checks(FakeProbe(environ={"VLLM_PLUGINS": "other, kog"})))["kog_backend"].status == "ok"
    c = by_name(checks.run_checks(FakeProbe(environ={"KOG_DISABLE_PLATFORM": "1"})))["kog_backend"]
    assert c.status == "warn" and "KOG_DISABLE_PLATFORM" in c.summary and "--worker-cls" in c.fix
    assert by_name(checks.run_checks(FakeProbe(environ={"KOG_DISABLE_PLATFORM": "0"})))["kog_backend"].status == "ok"
    other = {"vllm.platform_plugins": ["kog", "tpu_inference"]}
    c = by_name(checks.run_checks(FakeProbe(entry_points=other)))["kog_backend"]
    assert c.status == "warn" and "tpu_inference" in c.summary
    # a platform plugin that VLLM_PLUGINS does not load does not count
    ok = FakeProbe(entry_points=other, environ={"VLLM_PLUGINS": "kog"})
    assert by_name(checks.run_checks(ok))["kog_backend"].status == "ok"


def test_nccl_wheel_missing():
    probe = FakeProbe()
    del probe.versions["nvidia-nccl-cu13"]
    assert by_name(checks.run_checks(probe))["NCCL"].status == "warn"


def test_p2p_all_pairs():
    gpus = [GpuInfo(i, "NVIDIA H200", (9, 0), 139.8) for i in range(4)]
    probe = FakeProbe(gpus=gpus)
    c = by_name(checks.run_checks(probe))["P2P"]
    assert c.status == "ok" and "12 ordered pairs" in c.summary
    assert sorted(probe.p2p_calls) == [(a, b) for a in range(4) for b in range(4) if a != b]


def test_p2p_failures_warn():
    gpus = [GpuInfo(i, "NVIDIA H200", (9, 0), 139.8) for i in range(2)]

    def p2p(s, d):
        if (s, d) == (0, 1):
            return P2PResult(s, d, False, True)
        return P2PResult(s, d, True, False, error="RuntimeError: CUDA error: peer mapping resources exhausted")

    res = checks.run_checks(FakeProbe(gpus=gpus, p2p=p2p))
    c = by_name(res)["P2P"]
    assert c.status == "warn" and "0->1: no peer access" in c.summary and "1->0: RuntimeError" in c.summary
    assert checks.exit_status(res) == 0  # one-GPU serving still runs kog
    skipped = by_name(checks.run_checks(FakeProbe(gpus=gpus, p2p=p2p), p2p=False))["P2P"]
    assert skipped.status == "skip"


def test_features_come_from_the_gates():
    secs = dict(features.sections())
    assert secs[features.REQUEST] == list(eligibility.REQUEST_FEATURES.values())
    assert secs[features.SERVER] == list(eligibility.SERVER_FEATURES.values())
    assert secs[features.KOG_PATH] == list(eligibility.KOG_PATH_FEATURES)
    text = report.format_features(features.sections())
    for reason in [*eligibility.REQUEST_FEATURES.values(), *eligibility.KOG_PATH_FEATURES]:
        assert f"  - {reason}" in text
    assert "LlamaForCausalLM" in text and "Qwen3ForCausalLM" in text


def test_json_output():
    res = checks.run_checks(FakeProbe(gpus=[]))
    data = json.loads(report.to_json(res, features.sections()))
    assert data["exit_status"] == 1
    assert {c["name"] for c in data["checks"]} >= {"GPU", "vLLM", "torch", "driver", "extension", "NCCL", "P2P"}
    assert any("stock" in title for title in data["features"])


def test_command_on_this_machine(capsys):
    """The real probe. Without a GPU (CI) the GPU-dependent checks say "no GPU" and the exit status is 1."""
    import torch

    p = argparse.ArgumentParser()
    doctor_cmd.add_arguments(p)
    code = doctor_cmd.run(p.parse_args(["--skip-p2p"]))
    out = capsys.readouterr().out
    assert "[" in out and "GPU" in out and "Runs on the kog path" in out
    if not torch.cuda.is_available():
        assert code == 1
        assert "[FAIL] GPU" in out and "no GPU" in out and "would NOT run" in out
    code_json = doctor_cmd.run(p.parse_args(["--json", "--skip-p2p"]))
    assert json.loads(capsys.readouterr().out)["exit_status"] == code_json == code


def test_real_probe_extension_reports_the_load_reason(monkeypatch):
    from kog_backend import ops

    monkeypatch.setattr(ops, "load_reason", lambda: "kog_backend._C is version 0, this package expects 1 (rebuild the extension)")
    ok, detail = Probe().extension()
    assert not ok and "rebuild the extension" in detail
    monkeypatch.setattr(ops, "load_reason", lambda: None)
    monkeypatch.setattr(ops, "extension_path", lambda: "/x/_C.abi3.so")
    assert Probe().extension() == (True, "/x/_C.abi3.so")

    def broken():
        raise OSError("undefined symbol: _ZN3c10")

    monkeypatch.setattr(ops, "load_reason", broken)
    ok, detail = Probe().extension()
    assert not ok and "undefined symbol" in detail


def _doctor(capsys, *argv):
    p = argparse.ArgumentParser()
    doctor_cmd.add_arguments(p)
    code = doctor_cmd.run(p.parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_model_verdict_by_name_without_gpu(capsys):
    """`kog doctor --model NAME`: the published config through the gate's checks and the plan, memory stated for
    the named card; no GPU, no server."""
    code, out = _doctor(capsys, "--model", "Qwen/Qwen2.5-Coder-32B-Instruct")
    assert code == 0 and "[ok  ] kog path: qwen2" in out and "QKV bias" in out and "54 KiB" in out
    assert "fits, KV cache for ~" in out and "would run this model" in out
    code, out = _doctor(capsys, "--model", "qwen3-4b", "--json", "--gpu", "h200")
    data = json.loads(out)
    assert code == 0 and data["runs"] and data["reason"] is None and data["gpu"] == "h200"


def test_model_refusal_prints_the_gates_reason(capsys, tmp_path):
    from kog_backend.path import coverage
    from kog_backend.tools.fixtures import shapes

    cfg = dict(shapes.MODEL_CONFIGS["Qwen/Qwen2.5-Coder-32B-Instruct"],
               rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    code, out = _doctor(capsys, "--model", str(tmp_path))
    reason = coverage.verdict(cfg).reason
    assert code == 1 and f"[FAIL] kog path: {reason}" in out and "rope_scaling 'yarn'" in reason
    big = dict(shapes.MODEL_CONFIGS["Qwen/Qwen2.5-32B-Instruct"], num_hidden_layers=80)
    (tmp_path / "config.json").write_text(json.dumps(big))
    code, out = _doctor(capsys, "--model", str(tmp_path))
    assert code == 1 and "[FAIL] memory on h100" in out and "does not fit" in out
    code, out = _doctor(capsys, "--model", "no-such/model")
    assert code == 2 and "known:" in out


def test_reasons_lists_the_gate_catalogue(capsys):
    """`kog doctor --reasons`: every reason the gate can return, by level; exit status 0 whatever the machine."""
    from kog_backend.path import gate

    code, out = _doctor(capsys, "--reasons")
    assert code == 0 and "gate level step:" in out and "  - prefill" in out
    assert out.count("\n  - ") + out.startswith("  - ") == len(gate.catalogue())
    code, out = _doctor(capsys, "--reasons", "--json")
    data = json.loads(out)
    assert code == 0 and sum(len(v) for v in data.values()) == len(gate.catalogue())
