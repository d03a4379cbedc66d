"""storage: write and read throughput of the node's scratch filesystem.

Writes `bytes` of random data to a new file under `path` (default: the agent's scratch
dir) in 16 MiB writes and fsyncs it (the write time includes the fsync), drops the
file's pages from the page cache (posix_fadvise DONTNEED; the pages are clean after the
fsync, so the kernel lets them go), reads it back, and removes the file whatever
happens. MB/s are 10^6 bytes per second.

page_cache_dropped in the metrics is false where the pages could not be dropped (no
posix_fadvise); then the read measures memory, not the disk. On tmpfs the file lives in
memory anyway."""

import contextlib
import os
import secrets
import shutil
import time

from agent.checks import CheckError, failed, passed
from agent.checks.params import Param
from agent.checks.params import read_params as read_spec

MiB = 2**20
CHUNK_BYTES = 16 * MiB
FREE_RESERVE_BYTES = 256 * MiB  # never fill the filesystem to the last byte
STARTUP_S = 30.0
SLOWEST_MBPS = 20.0  # the time limit lets storage this slow finish (fail, not time out)

PARAMS = {
    "path": Param("string", help="directory to write in (default: the agent's scratch dir)"),
    "bytes": Param("int", default=2**30, minimum=MiB, maximum=2**40, help="bytes written"),
    "min_write_mbps": Param("number", minimum=0, help="the least write MB/s"),
    "min_read_mbps": Param("number", minimum=0, help="the least read MB/s"),
}


def read_params(params):
    return read_spec(params, PARAMS)


def time_limit_s(params, gpu_count):
    return STARTUP_S + 2 * params["bytes"] / (SLOWEST_MBPS * 1e6)


def decide(measurements, params, inventory):
    """measurements: {"path", "bytes", "write_mbps", "read_mbps", "page_cache_dropped"}."""
    metrics = dict(measurements)
    problems = []
    for direction in ("write", "read"):
        value = measurements[f"{direction}_mbps"]
        minimum = params[f"min_{direction}_mbps"]
        if minimum is not None and value < minimum:
            problems.append(
                f"{direction} {value:g} MB/s on {measurements['path']}, below the minimum "
                f"{minimum:g}"
            )
    if problems:
        return failed(metrics, problems)
    if params["min_write_mbps"] is None and params["min_read_mbps"] is None:
        return passed(metrics, "measured; no baseline given")
    return passed(
        metrics,
        f"write {measurements['write_mbps']:g} MB/s, read {measurements['read_mbps']:g} MB/s "
        f"on {measurements['path']}: at or above the minimums",
    )


# The child process


def measure(request):
    params = request["params"]
    directory = params["path"] or request["scratch_dir"]
    size = params["bytes"]
    if not os.path.exists(directory):
        raise CheckError(f"{directory} does not exist")
    if not os.path.isdir(directory):
        raise CheckError(f"{directory} is not a directory")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CheckError(f"{directory} is not writable by the agent (uid {os.getuid()})")
    free = shutil.disk_usage(directory).free
    if free < size + FREE_RESERVE_BYTES:
        raise CheckError(
            f"{directory} has {free} bytes free; the check needs {size} and leaves "
            f"{FREE_RESERVE_BYTES} free"
        )

    file_path = os.path.join(
        directory, f".clusterui-storage-check-{os.getpid()}-{secrets.token_hex(4)}"
    )
    try:
        write_s, dropped = _write(file_path, size)
        read_s = _read(file_path, size)
    except OSError as exc:
        raise CheckError(f"{file_path}: {exc.strerror or exc}") from exc
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(file_path)
    return {
        "path": directory,
        "bytes": size,
        "write_mbps": round(size / write_s / 1e6, 1),
        "read_mbps": round(size / read_s / 1e6, 1),
        "page_cache_dropped": dropped,
    }


def _write(file_path, size):
    """(seconds for the writes and the fsync, whether the pages were dropped after)."""
    block = memoryview(os.urandom(min(CHUNK_BYTES, size)))
    fd = os.open(file_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        start = time.perf_counter()
        left = size
        while left:
            view = block[: min(left, len(block))]
            while view:
                written = os.write(fd, view)
                view = view[written:]
                left -= written
        os.fsync(fd)
        seconds = time.perf_counter() - start
        return seconds, _drop_pages(fd)
    finally:
        os.close(fd)


def _drop_pages(fd):
    if not hasattr(os, "posix_fadvise"):
        return False
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        return False
    return True


def _read(file_path, size):
    buffer = bytearray(CHUNK_BYTES)
    fd = os.open(file_path, os.O_RDONLY)
    try:
        total = 0
        start = time.perf_counter()
        while True:
            count = os.readv(fd, [buffer])
            if count == 0:
                break
            total += count
        seconds = time.perf_counter() - start
    finally:
        os.close(fd)
    if total != size:
        raise CheckError(f"{file_path}: read back {total} bytes of the {size} written")
    return seconds
