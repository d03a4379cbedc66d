"""Xid lines from the kernel log: real NVRM lines as drivers write them, read from a
kmsg-format file by the reader thread, and the simulated kernel log."""

import logging
import os
import time

import pytest

from agent.detectors import kernel_log
from agent.detectors.kernel_log import KmsgReader, parse_xid_line
from agent.detectors.xid import XidSignal, pci_key
from agent.sim.kernel_log import SimulatedKernelLog

# Real lines (kernel logs quoted in public bug reports and tools' tests), with the
# prefixes they came with: a kmsg record, dmesg's timestamp, syslog/journal.
REAL_XID_LINES = [
    (
        "4,1234,5678901,-;NVRM: Xid (PCI:0000:00:06): 79, pid=1234, name=python3, "
        "GPU has fallen off the bus.",
        "0000:00:06",
        79,
    ),
    (
        "[1235733.431527] NVRM: Xid (PCI:0000:4e:00): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
        "0000:4e:00",
        79,
    ),
    (
        "Jan 22 18:38:35 fnOS-device kernel: NVRM: Xid (PCI:0000:81:00): 31, "
        "pid='<unknown>', name=<unknown>, Ch 00000016, intr 10000000. MMU Fault: ENGINE "
        "GRAPHICS HUBCLIENT_FECS faulted @ 0x0_00000000. Fault is of type FAULT_PDE "
        "ACCESS_TYPE_READ",
        "0000:81:00",
        31,
    ),
    (
        "NVRM: Xid (PCI:0000:00:06): 31, pid=79749, name=exe, Ch 0000000a, intr 00000000. "
        "MMU Fault: ENGINE GRAPHICS GPC2 GPCCLIENT_T1_7 faulted @ 0x2b57_b3000000. Fault is "
        "of type FAULT_PDE ACCESS_TYPE_VIRT_WRITE",
        "0000:00:06",
        31,
    ),
    ("NVRM: Xid (PCI:0000:23:00): 79, GPU has fallen off the bus.", "0000:23:00", 79),
    ("kernel: NVRM: Xid (PCI:0000:01:00): 79, pid=1122, GPU has fallen off the bus.", "0000:01:00", 79),
    ("[...] NVRM: Xid (0000:03:00): 14, Channel 00000001", "0000:03:00", 14),
    (
        "NVRM: Xid (PCI:0008:01:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)",
        "0008:01:00",
        154,
    ),
]


@pytest.mark.parametrize("line, pci, code", REAL_XID_LINES)
def test_real_xid_lines_are_parsed(line, pci, code):
    signal = parse_xid_line(line, "kmsg")

    assert (signal.source, signal.code, signal.pci_bus_id) == ("kmsg", code, pci)
    assert signal.kernel_line == line[line.index("NVRM:") :]
    assert signal.gpu_uuid is None


@pytest.mark.parametrize(
    "line",
    [
        "NVRM: GPU at PCI:0000:81:00: GPU-71dcdf29-68ae-87d1-b57b-86d9f8f01ffc",
        "NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.",
        "NVRM: GPU Board Serial Number: 0422318024689",
        "[1235733.431527] nvidia-nvswitch3: SXid (PCI:0000:4e:00.0): 12028, Non-fatal, Link "
        "32 egress non-posted PRIV error (First)",
        "6,1,0,-;Linux version 6.8.0-49-generic (buildd@lcy02-amd64-103)",
        " SUBSYSTEM=pci",
        "NVRM: Xid (PCI:0000:66:00): abc, pid=2280636",
        "",
    ],
)
def test_other_kernel_lines_are_not_xids(line):
    assert parse_xid_line(line, "kmsg") is None


@pytest.mark.parametrize(
    "line, action, text",
    [
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x2 (Node Reboot Required)",
            2,
            "Node Reboot Required",
        ),
        (
            "NVRM: Xid (PCI:0000:0d:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x1 (PF FLR)",
            1,
            "PF FLR",
        ),
        (
            "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) "
            "to 0x2 (OS Reboot)",
            2,
            "OS Reboot",
        ),
    ],
)
def test_xid_154_carries_the_recovery_action(line, action, text):
    signal = parse_xid_line(line, "kmsg")

    assert signal.code == 154
    assert signal.extra == {"recovery_action": action, "recovery_action_text": text}


@pytest.mark.parametrize(
    "bus_id, key",
    [
        ("00000000:00:06.0", (0, 0, 6)),  # NVML (the real H200)
        ("0000:00:06", (0, 0, 6)),  # the kernel's Xid line
        ("0000:00:0b", (0, 0, 11)),
        ("00000000:00:0B.0", (0, 0, 11)),
        ("0008:01:00", (8, 1, 0)),
        ("00000008:01:00.0", (8, 1, 0)),
        ("0000:4e:00", (0, 0x4E, 0)),
        ("GPU-dd6e", None),
        ("zz:00:06", None),
    ],
)
def test_pci_addresses_are_normalised(bus_id, key):
    assert pci_key(bus_id) == key


def wait_for_signals(reader, count, timeout_s=5.0):
    """The reader thread's signals, once `count` have come (or the test fails)."""
    signals = []
    deadline = time.monotonic() + timeout_s
    while len(signals) < count:
        assert time.monotonic() < deadline, f"only {len(signals)} of {count} signals came"
        signals.extend(reader.take_signals())
        time.sleep(0.01)
    return signals


def test_the_reader_skips_the_backlog_and_reads_new_records(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text(
        "4,900,1000,-;NVRM: Xid (PCI:0000:00:06): 13, pid=1, name=old, Graphics Exception\n"
    )
    reader = KmsgReader(str(kmsg))
    reader.start()
    try:
        with open(kmsg, "a") as f:
            f.write(
                "6,901,2000,-;nvidia 0000:00:06.0: enabling device\n"
                " SUBSYSTEM=pci\n"
                " DEVICE=+pci:0000:00:06.0\n"
                "4,902,3000,-;NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', "
                "name=<unknown>, GPU has fallen off the bus.\n"
            )
        [signal] = wait_for_signals(reader, 1)
    finally:
        reader.close()

    assert signal == XidSignal(
        source="kmsg",
        code=79,
        pci_bus_id="0000:00:06",
        kernel_line="NVRM: Xid (PCI:0000:00:06): 79, pid='<unknown>', name=<unknown>, "
        "GPU has fallen off the bus.",
    )


def test_a_line_written_in_two_pieces_is_read_whole(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    reader = KmsgReader(str(kmsg))
    reader.start()
    try:
        with open(kmsg, "a") as f:
            f.write("4,1,1,-;NVRM: Xid (PCI:0000:00:06): 4")
            f.flush()
            time.sleep(0.1)  # the reader sees the first piece on its own
            f.write("8, pid=3, name=python3, Double Bit ECC Error.\n")
        [signal] = wait_for_signals(reader, 1)
    finally:
        reader.close()

    assert signal.code == 48


def test_the_reader_takes_a_storm_of_10000_lines(tmp_path):
    kmsg = tmp_path / "kmsg"
    kmsg.write_text("")
    reader = KmsgReader(str(kmsg))
    reader.start()
    line = "NVRM: Xid (PCI:0000:00:06): 13, pid=4242, name=python3, Graphics Exception"
    try:
        with open(kmsg, "a") as f:
            f.writelines(f"4,{seq},{seq * 10},-;{line}\n" for seq in range(10_000))
        signals = wait_for_signals(reader, 10_000)
    finally:
        reader.close()

    assert len(signals) == 10_000
    assert {(s.code, s.kernel_line) for s in signals} == {(13, line)}


def test_a_missing_kernel_log_is_logged_once_and_not_read(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    reader = KmsgReader(str(tmp_path / "no-kmsg"))
    reader.start()
    reader.close()

    assert not reader.available
    [record] = caplog.records
    assert record.getMessage() == (
        f"cannot read the kernel log {tmp_path / 'no-kmsg'} (No such file or directory): "
        "Xids come from NVML events only"
    )


def test_permission_denied_is_logged_once_and_not_read(tmp_path, caplog, monkeypatch):
    # The tests run as root, who may read anything: refuse the open at the point of use.
    real_open = os.open

    def refusing_open(path, flags, *args):
        if path == "/dev/kmsg":
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args)

    monkeypatch.setattr(kernel_log.os, "open", refusing_open)
    caplog.set_level(logging.WARNING)
    reader = KmsgReader("/dev/kmsg")

    assert not reader.available
    assert reader.take_signals() == []
    [record] = caplog.records
    assert record.getMessage() == (
        "cannot read the kernel log /dev/kmsg (Permission denied): Xids come from NVML "
        "events only; run the agent as root"
    )


def test_the_real_dev_kmsg_opens_at_its_end_and_closes(caplog):
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg cannot be read here")
    reader = KmsgReader()
    reader.start()
    time.sleep(0.1)
    reader.close()

    assert reader.path == "/dev/kmsg"
    assert not reader._thread.is_alive()
    assert "cannot read" not in caplog.text and "failed" not in caplog.text


def test_the_simulated_kernel_log_writes_kmsg_records_read_by_the_same_parser():
    log = SimulatedKernelLog()
    log.write("NVRM: Xid (PCI:0000:00:0b): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
    log.write("nvidia-modeset: Loading NVIDIA Kernel Mode Setting Driver")

    [signal] = log.take_signals()

    assert (signal.source, signal.code, signal.pci_bus_id) == ("simulated_kmsg", 79, "0000:00:0b")
    assert log.take_signals() == []
