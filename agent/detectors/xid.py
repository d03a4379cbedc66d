"""Xid errors from two sources, NVML's event set and the kernel log, made into one stream
of `xid:<code>` events.

Each source hands over XidSignals. The watcher groups them by (GPU, code) into bursts:

- de-duplication: the driver reports one Xid to both sources, so each source counts
  what it saw and a burst counts the larger of the two, never the sum; the event's
  detail names every source that saw it ("kmsg+nvml") and keeps the first raw kernel
  line;
- coalescing: the first signal of a burst goes out at the next poll (count 1, or more
  if more arrived by then); repeats are gathered and go out at most once every
  `window_s` seconds (default 10) as one frame whose `count` says how many. A storm of
  10,000 identical lines is a few frames whose counts sum to 10,000;
- a burst ends once it has been quiet for `window_s`; the next signal starts a new one.

Severity is always "critical": the server sets an Xid's severity from NVIDIA's catalog.
The message is the catalog's description of the code (agent/data/xid_catalog.tsv)."""

import queue
import threading
import time
from dataclasses import dataclass, field
from importlib import resources

from agent.connection.protocol import event_frame

WINDOW_S = 10.0


class XidSource:
    """What the two Xid sources share: a daemon thread (`_run`, named `thread_name`) that
    puts XidSignals on a queue until `_stopping` is set, and take_signals() to drain it.
    A subclass sets `available` and calls _stop_thread() from its close()."""

    thread_name = "xid"

    def __init__(self):
        self._signals = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = None

    def start(self):
        if self.available:
            self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
            self._thread.start()

    def take_signals(self):
        signals = []
        while True:
            try:
                signals.append(self._signals.get_nowait())
            except queue.Empty:
                return signals

    def _stop_thread(self):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


@dataclass(frozen=True)
class XidSignal:
    """One Xid as one source saw it. A kernel line names the GPU by PCI address, NVML by
    uuid. `extra` holds what the line adds (Xid 154: the recovery action)."""

    source: str  # "kmsg", "nvml", or another XidSource's (the simulation's kernel log)
    code: int
    pci_bus_id: str | None = None
    gpu_uuid: str | None = None
    kernel_line: str | None = None
    extra: dict = field(default_factory=dict)


def load_xid_descriptions():
    """{code: description} from agent/data/xid_catalog.tsv (NVIDIA's Xid catalog)."""
    lines = (resources.files("agent") / "data" / "xid_catalog.tsv").read_text().splitlines()
    header = lines[0].split("\t")
    code_column, description_column = header.index("code"), header.index("description")
    descriptions = {}
    for line in lines[1:]:
        columns = line.split("\t")
        descriptions[int(columns[code_column])] = columns[description_column]
    return descriptions


def pci_key(bus_id):
    """(domain, bus, device) of a PCI address as NVML writes it ("00000000:00:06.0") or the
    kernel's Xid line does ("0000:00:06"); None if it is neither."""
    parts = bus_id.split(":")
    if len(parts) != 3:
        return None
    domain, bus, device = parts
    try:
        return int(domain, 16), int(bus, 16), int(device.split(".")[0], 16)
    except ValueError:
        return None


class _Burst:
    def __init__(self, signal, now):
        self.code = signal.code
        self.pci_bus_id = signal.pci_bus_id
        self.counts = {}  # source -> signals it gave
        self.kernel_line = None
        self.extra = {}
        self.last_at = now
        self.reported = 0  # signals already sent
        self.reported_at = None

    def add(self, signal, now):
        self.counts[signal.source] = self.counts.get(signal.source, 0) + 1
        if self.kernel_line is None and signal.kernel_line is not None:
            self.kernel_line = signal.kernel_line
        self.extra.update(signal.extra)
        self.last_at = now

    def total(self):
        return max(self.counts.values())


class XidWatcher:
    def __init__(self, gpus, sources, window_s=WINDOW_S, clock=time.monotonic):
        """gpus: the hello's GPU list (uuid, pci_bus_id), taken once at start, so a GPU
        lost later still maps; sources: objects with take_signals() and close()."""
        self.window_s = window_s
        self.sources = list(sources)
        self._clock = clock
        self._uuid_by_pci = {pci_key(gpu["pci_bus_id"]): gpu["uuid"] for gpu in gpus}
        self._descriptions = load_xid_descriptions()
        self._bursts = {}  # (gpu uuid or None, code, pci key) -> _Burst

    def poll(self, readings):
        now = self._clock()
        for source in self.sources:
            for signal in source.take_signals():
                self._add(signal, now)
        events = []
        for key, burst in list(self._bursts.items()):
            unsent = burst.total() - burst.reported
            if unsent > 0 and (
                burst.reported_at is None or now - burst.reported_at >= self.window_s
            ):
                events.append(self._event(key[0], burst, unsent))
                burst.reported += unsent
                burst.reported_at = now
            elif unsent == 0 and now - burst.last_at >= self.window_s:
                del self._bursts[key]
        return events

    def close(self):
        for source in self.sources:
            source.close()

    def _add(self, signal, now):
        gpu_uuid = signal.gpu_uuid
        pci = None
        if gpu_uuid is None and signal.pci_bus_id is not None:
            pci = pci_key(signal.pci_bus_id)
            gpu_uuid = self._uuid_by_pci.get(pci)
        # A line naming no GPU of ours keeps its address in the key and the detail.
        key = (gpu_uuid, signal.code, pci if gpu_uuid is None else None)
        burst = self._bursts.get(key)
        if burst is None:
            burst = self._bursts[key] = _Burst(signal, now)
        burst.add(signal, now)

    def _event(self, gpu_uuid, burst, count):
        detail = {
            "xid": burst.code,
            "source": "+".join(sorted(burst.counts)),
            "kernel_line": burst.kernel_line,
            **burst.extra,
        }
        if gpu_uuid is None:
            detail["pci_bus_id"] = burst.pci_bus_id
        frame = event_frame(
            signature=f"xid:{burst.code}",
            severity="critical",
            message=self._descriptions.get(burst.code, f"Xid {burst.code}"),
            gpu_uuid=gpu_uuid,
            detail=detail,
        )
        frame["count"] = count
        return frame
