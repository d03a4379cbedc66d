"""Xid lines from the kernel log: the NVIDIA driver (NVRM) writes one line per Xid.

Real lines look like (kmsg records: `<priority>,<seq>,<microseconds>,<flags>;<message>`):

    4,1234,5678901,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python3, GPU has fallen off the bus.
    NVRM: Xid (PCI:0000:81:00): 31, pid='<unknown>', name=<unknown>, Ch 00000016, intr 10000000. MMU Fault: ...
    NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.
    NVRM: Xid (0000:03:00): 14, Channel 00000001                          (older drivers)
    NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)

parse_xid_line() finds the Xid in any of these, with or without a kmsg, dmesg or syslog
prefix. The evidence keeps the line from "NVRM:" on, as `dmesg` shows it.

KmsgReader reads /dev/kmsg in a thread, from its end: only lines the kernel writes after
the agent started. The backlog was either reported by the agent that ran then, or came
before any agent ran; replaying it at every restart would raise old Xids again as new
events (the server closes Xids on a reboot, not on an agent restart). A kernel log that
cannot be read (no permission, no /dev/kmsg) is logged once, and Xids then come from
NVML's events only.

The simulated backend's kernel log (agent/sim/kernel_log.py) goes through the same
parser."""

import errno
import logging
import os
import re
import select

from agent.detectors.xid import XidSignal, XidSource

log = logging.getLogger(__name__)

KMSG_PATH = "/dev/kmsg"
READ_BYTES = 8192  # /dev/kmsg hands one record per read and refuses a smaller buffer
WAIT_MS = 500  # how long the reader thread waits for a line before it checks for stop

_XID = re.compile(
    r"NVRM: Xid \((?:PCI:)?(?P<pci>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2})"
    r"(?:\.[0-7])?\): (?P<code>[0-9]+)\b"
)
_RECOVERY_ACTION = re.compile(
    r"GPU recovery action changed from 0x[0-9a-fA-F]+ \([^)]*\) "
    r"to (?P<value>0x[0-9a-fA-F]+) \((?P<text>[^)]*)\)"
)


def parse_xid_line(line, source):
    """The XidSignal in one kernel log line, or None if it holds no Xid."""
    match = _XID.search(line)
    if match is None:
        return None
    kernel_line = line[match.start() :].rstrip()
    extra = {}
    recovery = _RECOVERY_ACTION.search(kernel_line)
    if recovery is not None:
        extra = {
            "recovery_action": int(recovery["value"], 16),
            "recovery_action_text": recovery["text"],
        }
    return XidSignal(
        source=source,
        code=int(match["code"]),
        pci_bus_id=match["pci"],
        kernel_line=kernel_line,
        extra=extra,
    )


class KmsgReader(XidSource):
    thread_name = "kmsg-xid"
    source = "kmsg"

    def __init__(self, path=KMSG_PATH):
        self.path = path
        super().__init__()
        self._fd = None
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            log.warning(
                "cannot read the kernel log %s (%s): Xids come from NVML events only%s",
                path,
                exc.strerror,
                "; run the agent as root" if isinstance(exc, PermissionError) else "",
            )
            return
        try:
            os.lseek(fd, 0, os.SEEK_END)  # new lines only (see the module's docstring)
        except OSError as exc:
            if exc.errno != errno.ESPIPE:  # a pipe has no backlog to skip
                raise
        self._fd = fd
        log.info("reading Xid lines from %s (from now on)", path)

    @property
    def available(self):
        return self._fd is not None

    def close(self):
        self._stop_thread()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _run(self):
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        pending = b""
        overrun_logged = False
        while not self._stopping.is_set():
            if not poller.poll(WAIT_MS):
                continue
            try:
                chunk = os.read(self._fd, READ_BYTES)
            except BlockingIOError:
                continue
            except BrokenPipeError:
                # EPIPE: the kernel overwrote records before we read them (a storm of
                # lines); the next read goes on from the oldest record still there.
                if not overrun_logged:
                    log.warning("%s: lines were lost in a burst (the kernel log wrapped)", self.path)
                    overrun_logged = True
                continue
            except OSError as exc:
                log.error("reading %s failed (%s): Xids come from NVML events only", self.path, exc)
                return
            if not chunk:
                # A regular file at its end (a test, or a log replayed by hand): wait
                # for more, as poll() does not for files.
                self._stopping.wait(WAIT_MS / 1000)
                continue
            # /dev/kmsg gives whole records; a file gives chunks: split on newlines.
            # A record's continuation lines (" SUBSYSTEM=pci") start with a space.
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b" "):
                    continue
                signal = parse_xid_line(line.decode("utf-8", "replace"), self.source)
                if signal is not None:
                    log.debug("%s: %s", self.path, signal.kernel_line)
                    self._signals.put(signal)

