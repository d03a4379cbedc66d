from collections import namedtuple

from agent import node_metrics
from agent.node_metrics import NodeMetrics

Io = namedtuple("Io", "bytes_recv bytes_sent")


class Counters:
    """Stands in for psutil.net_io_counters(pernic=True)."""

    def __init__(self, **interfaces):
        self.interfaces = interfaces

    def __call__(self, pernic):
        assert pernic
        return {name: Io(*values) for name, values in self.interfaces.items()}


def test_rates_come_from_counter_deltas(monkeypatch):
    counters = Counters(eth0=(1_000, 500), ib0=(0, 0), lo=(0, 0))
    monkeypatch.setattr(node_metrics.psutil, "net_io_counters", counters)
    now = [100.0]
    metrics = NodeMetrics(clock=lambda: now[0], interfaces={"eth0", "ib0"})

    counters.interfaces = {"eth0": (3_000, 1_500), "ib0": (4_000, 0), "lo": (10**9, 10**9)}
    now[0] = 102.0
    reading = metrics.read()

    assert reading["net_rx_bps"] == (2_000 + 4_000) / 2  # loopback is not counted
    assert reading["net_tx_bps"] == 1_000 / 2
    assert 0 <= reading["cpu_pct"] <= 100
    assert reading["mem_used_bytes"] > 0


def test_an_interface_that_was_reset_or_is_new_sits_out_one_read(monkeypatch):
    counters = Counters(eth0=(10_000, 10_000))
    monkeypatch.setattr(node_metrics.psutil, "net_io_counters", counters)
    now = [0.0]
    metrics = NodeMetrics(clock=lambda: now[0], interfaces=set())

    counters.interfaces = {"eth0": (100, 100), "veth1": (5_000, 5_000)}
    now[0] = 1.0
    reading = metrics.read()
    assert (reading["net_rx_bps"], reading["net_tx_bps"]) == (0.0, 0.0)

    counters.interfaces = {"eth0": (1_100, 600), "veth1": (6_000, 5_000)}
    now[0] = 2.0
    reading = metrics.read()
    assert (reading["net_rx_bps"], reading["net_tx_bps"]) == (2_000.0, 500.0)


def test_physical_interfaces_are_those_with_a_device(tmp_path, monkeypatch):
    (tmp_path / "eth0" / "device").mkdir(parents=True)
    (tmp_path / "docker0").mkdir()
    (tmp_path / "lo").mkdir()
    monkeypatch.setattr(node_metrics, "SYS_CLASS_NET", str(tmp_path))

    assert node_metrics.physical_interfaces() == {"eth0"}
