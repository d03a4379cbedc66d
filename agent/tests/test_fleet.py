import pytest

from agent.config import InjectSpecError
from agent.sim.backend import SimulatedBackend
from agent.sim.fleet import SimulatedNodeMetrics
from agent.sim.inject import read_faults


def test_a_nodes_inject_file_schedules_its_faults(tmp_path):
    (tmp_path / "inject").write_text("# demo faults\nxid:79@90s:gpu3\nthermal@45s+60s:gpu5\n")
    faults = read_faults(str(tmp_path), gpu_count=8)
    assert [(f.kind, f.at_s, f.gpu) for f in faults] == [("xid", 90.0, 3), ("thermal", 45.0, 5)]


def test_no_inject_file_means_no_faults(tmp_path):
    assert read_faults(str(tmp_path), gpu_count=8) == []


def test_a_bad_inject_file_is_a_clear_error(tmp_path):
    (tmp_path / "inject").write_text("xid:79@90s:gpu9\n")
    with pytest.raises(InjectSpecError, match="gpu9"):
        read_faults(str(tmp_path), gpu_count=8)


def test_simulated_node_metrics_follow_the_gpus():
    backend = SimulatedBackend("gpu-001", gpu_count=8)
    metrics = SimulatedNodeMetrics(backend, phase=0).read()
    assert set(metrics) == {"cpu_pct", "mem_used_bytes", "net_rx_bps", "net_tx_bps"}
    assert 0 <= metrics["net_rx_bps"] <= 0.6e9 and metrics["mem_used_bytes"] > 0
