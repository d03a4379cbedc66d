"""The simulated backend's kernel log: the backend (agent/sim/backend.py) writes kmsg
records into it, and the Xid watcher reads them through the real parser
(agent.detectors.kernel_log.parse_xid_line), as it reads /dev/kmsg on a real node."""

import collections
import time

from agent.detectors.kernel_log import parse_xid_line


HISTORY_LINES = 5000


class SimulatedKernelLog:
    source = "simulated_kmsg"

    def __init__(self):
        self._records = []
        self._seq = 0
        self._started = time.monotonic()
        self._history = collections.deque(maxlen=HISTORY_LINES)

    def write(self, message, priority=4):
        """Append a message as a kmsg record (priority 4: kernel, warning)."""
        micros = int((time.monotonic() - self._started) * 1e6)
        self._records.append(f"{priority},{self._seq},{micros},-;{message}")
        self._history.append(f"[{micros / 1e6:12.6f}] {message}\n")
        self._seq += 1

    def since_boot(self):
        """The log since the simulated boot as dmesg prints it (its last HISTORY_LINES)."""
        return "".join(self._history).encode()

    def take_signals(self):
        records, self._records = self._records, []
        signals = (parse_xid_line(record, self.source) for record in records)
        return [signal for signal in signals if signal is not None]

    def close(self):
        pass  # nothing to release
