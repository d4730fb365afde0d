"""kog's Prometheus families (kog_backend.path.metrics) after a fake run: names, labels and values as vLLM's
/metrics would serve them, only this server's rank-0 counters, and the counters file gone at shutdown."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kog_backend.path import counters as counters_mod
from kog_backend.path.counters import StepCounters
from kog_backend.path.metrics import KogCollector


def _fake_run(path: str, server: str, monkeypatch) -> StepCounters:
    monkeypatch.setenv(counters_mod.SERVER_ENV, server)
    c = StepCounters(path=path)
    for _ in range(5):
        c.record_kog(32)
    c.record_kog(7)
    c.record_fallback("prefill")
    c.record_fallback("prefill")
    c.record_fallback("2 requests in the step")
    c.record_launch_abort()
    c.disable("kernel abort: counter wait timed out in block 3")
    for _ in range(4):
        c.record_fallback("kernel abort: counter wait timed out in block 3")
    c.flush()
    return c


def _scrape(directory: str, server: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    reg = CollectorRegistry()
    reg.register(KogCollector(directory=directory, server=server))
    text = generate_latest(reg).decode()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.name.endswith("_created"):
                out.setdefault(s.name, []).append((dict(s.labels), s.value))
    return out


def test_families_after_a_fake_run(tmp_path, monkeypatch):
    _fake_run(str(tmp_path / "stats-11-rank0.json"), "100", monkeypatch)
    m = _scrape(str(tmp_path), "100")
    assert m["kog:steps_total"] == [({}, 6.0)]
    assert m["kog:generated_tokens_total"] == [({}, 167.0)]
    assert {lab["reason"]: v for lab, v in m["kog:stock_steps_total"]} == {
        "prefill": 2.0, "2 requests in the step": 1.0, "kernel abort: counter wait timed out in block 3": 4.0,
    }
    assert m["kog:launch_aborts_total"] == [({}, 1.0)]
    assert m["kog:disabled"] == [({"reason": "kernel abort: counter wait timed out in block 3"}, 1.0)]


def test_only_this_servers_rank0(tmp_path, monkeypatch):
    _fake_run(str(tmp_path / "stats-11-rank0.json"), "100", monkeypatch)
    monkeypatch.setenv(counters_mod.SERVER_ENV, "200")
    other = StepCounters(path=str(tmp_path / "stats-22-rank0.json"))
    other.record_kog(1)
    other.flush()
    monkeypatch.setenv(counters_mod.SERVER_ENV, "100")
    rank1 = StepCounters(path=str(tmp_path / "stats-12-rank1.json"))
    rank1.record_kog(999)
    rank1.flush()
    assert _scrape(str(tmp_path), "100")["kog:steps_total"] == [({}, 6.0)]
    assert _scrape(str(tmp_path), "200")["kog:steps_total"] == [({}, 1.0)]
    # An enabled server has no kog:disabled sample; a server with no worker file yet has no samples at all.
    assert "kog:disabled" not in _scrape(str(tmp_path), "200")
    assert _scrape(str(tmp_path), "300") == {}


def test_counters_file_removed_at_shutdown(tmp_path, monkeypatch):
    path = tmp_path / "stats-11-rank0.json"
    c = _fake_run(str(path), "100", monkeypatch)
    assert path.exists()
    c.remove()
    assert not path.exists()
    c.record_kog(1)
    c.flush()  # after removal nothing is written again
    assert not path.exists()
    assert _scrape(str(tmp_path), "100") == {}


def test_a_worker_named_by_a_child_of_the_server_counts(tmp_path, monkeypatch):
    # The engine process named the server (it loaded kog first): its pid descends from the API server's.
    import os

    _fake_run(str(tmp_path / "stats-11-rank0.json"), str(os.getpid()), monkeypatch)
    assert _scrape(str(tmp_path), str(os.getppid()))["kog:steps_total"] == [({}, 6.0)]
    assert _scrape(str(tmp_path), "1")["kog:steps_total"] == [({}, 6.0)]  # init is everyone's ancestor


def test_multiprocess_registry_serves_kog_families(tmp_path, monkeypatch):
    """--api-server-count > 1: vLLM's get_prometheus_registry returns a fresh registry with a MultiProcessCollector
    per API server; wrapped, that registry also serves kog's families (from the same worker files)."""
    from prometheus_client import REGISTRY

    from kog_backend.path import metrics

    state = tmp_path / "state"
    state.mkdir()
    _fake_run(str(state / "stats-11-rank0.json"), "100", monkeypatch)
    monkeypatch.setenv("KOG_STATE_DIR", str(state))
    prom_dir = tmp_path / "prom"
    prom_dir.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(prom_dir))

    from vllm.v1.metrics import prometheus as vllm_prom

    # vLLM's own function, whether or not a plugin call earlier in this process wrapped it already.
    original = getattr(vllm_prom.get_prometheus_registry, "__wrapped__", vllm_prom.get_prometheus_registry)
    wrapped = metrics.with_kog_collector(original)
    registry = wrapped()
    assert registry is not REGISTRY
    text = generate_latest(registry).decode()
    assert "kog:steps_total 6.0" in text and "kog:launch_aborts_total 1.0" in text
    # A second API server's registry is fresh too: its own collector, no duplicate registration error.
    assert "kog:steps_total 6.0" in generate_latest(wrapped()).decode()
    # Unwrapped, the multiprocess registry has no kog family: what the hook is for.
    assert "kog:" not in generate_latest(original()).decode()


def test_default_registry_is_left_alone(monkeypatch):
    """One API server: vLLM serves prometheus_client's default registry, where register_collector put kog's
    collector; the wrapper must not register a second one (that would raise on duplicated names)."""
    from prometheus_client import REGISTRY

    from kog_backend.path import metrics

    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    before = dict(REGISTRY._collector_to_names)
    assert metrics.with_kog_collector(lambda: REGISTRY)() is REGISTRY
    assert dict(REGISTRY._collector_to_names) == before


def test_serve_on_multiprocess_registry_wraps_both_modules_once(monkeypatch):
    import importlib

    from kog_backend.path import metrics

    prom = importlib.import_module("vllm.v1.metrics.prometheus")
    mount = importlib.import_module("vllm.entrypoints.serve.instrumentator.metrics")
    monkeypatch.setattr(prom, "get_prometheus_registry", prom.get_prometheus_registry)
    monkeypatch.setattr(mount, "get_prometheus_registry", mount.get_prometheus_registry)
    metrics.serve_on_multiprocess_registry()
    first = (prom.get_prometheus_registry, mount.get_prometheus_registry)
    assert all(getattr(f, metrics._WRAPPED, False) for f in first)
    metrics.serve_on_multiprocess_registry()  # idempotent: no wrapper around the wrapper
    assert (prom.get_prometheus_registry, mount.get_prometheus_registry) == first
