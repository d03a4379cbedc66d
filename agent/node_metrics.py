"""The node part of a sample: CPU, memory and network, from psutil. Network rates come
from the change in the kernel's per-interface byte counters since the previous read."""

import os
import time

import psutil

SYS_CLASS_NET = "/sys/class/net"


class NodeMetrics:
    def __init__(self, clock=time.monotonic, interfaces=None):
        """interfaces: the names to count; by default the physical ones (those with a
        device in /sys/class/net, so container veths and bridges are not counted twice),
        or every one but loopback where there are none."""
        self._clock = clock
        self._interfaces = interfaces if interfaces is not None else physical_interfaces()
        psutil.cpu_percent(interval=None)  # the first call only sets the baseline
        self._last_time = clock()
        self._last_counters = self._counters()

    def read(self):
        """{"cpu_pct", "mem_used_bytes", "net_rx_bps", "net_tx_bps"} since the last read."""
        now = self._clock()
        counters = self._counters()
        elapsed = now - self._last_time
        rx_bytes = tx_bytes = 0
        for name, (rx, tx) in counters.items():
            last = self._last_counters.get(name)
            # An interface that just appeared, or whose counters were reset, sits out
            # this one read.
            if last is not None and rx >= last[0] and tx >= last[1]:
                rx_bytes += rx - last[0]
                tx_bytes += tx - last[1]
        self._last_time, self._last_counters = now, counters

        memory = psutil.virtual_memory()
        return {
            "cpu_pct": psutil.cpu_percent(interval=None),
            # "available" is what programs can still get; the rest is in use.
            "mem_used_bytes": memory.total - memory.available,
            "net_rx_bps": rx_bytes / elapsed if elapsed > 0 else None,
            "net_tx_bps": tx_bytes / elapsed if elapsed > 0 else None,
        }

    def _counters(self):
        """{interface: (bytes received, bytes sent)} for the interfaces we count."""
        counters = {}
        for name, io in psutil.net_io_counters(pernic=True).items():
            if name == "lo" or (self._interfaces and name not in self._interfaces):
                continue
            counters[name] = (io.bytes_recv, io.bytes_sent)
        return counters


def physical_interfaces():
    """Names of the network interfaces backed by a device (NICs, not veths or bridges);
    an empty set where there are none or /sys is not there."""
    try:
        names = os.listdir(SYS_CLASS_NET)
    except OSError:
        return set()
    return {name for name in names if os.path.exists(os.path.join(SYS_CLASS_NET, name, "device"))}
