"""torch or CuPy for the compute checks: which one can run, the CUDA devices it sees,
and timing with CUDA events. Imported in the check's child process only: importing
torch takes seconds and a CUDA context, which the agent's own process never holds.

The child runs with CUDA_DEVICE_ORDER=PCI_BUS_ID and without CUDA_VISIBLE_DEVICES
(runner.child_environment), so CUDA device i is NVML's GPU i."""

import importlib
import sys

from agent.checks import CheckError

LIBRARIES = ("torch", "cupy")


def pick_library(wanted=None):
    """(name, module) of the first library that sees a CUDA device: `wanted` only, or
    torch, then CuPy. Raises CheckError saying why none can run."""
    reasons = []
    missing = []
    for name in [wanted] if wanted else LIBRARIES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            missing.append(name)
            continue
        except Exception as exc:  # a broken install (a CUDA library that does not load)
            reasons.append(f"{name} cannot be imported: {exc}")
            continue
        reason = _why_unusable(name, module)
        if reason is None:
            return name, module
        reasons.append(reason)
    if missing and not reasons:
        if len(missing) == 1:
            raise CheckError(f"{missing[0]} is not installed for {sys.executable}")
        raise CheckError(
            f"neither torch nor cupy is installed for {sys.executable}: the compute "
            f"checks need one of them on the node"
        )
    reasons += [f"{name} is not installed" for name in missing]
    raise CheckError(f"no GPU compute library can run: {'; '.join(reasons)}")


def _why_unusable(name, module):
    version = getattr(module, "__version__", "?")
    if name == "torch":
        if module.version.cuda is None:
            return f"torch {version} is built without CUDA"
        if not module.cuda.is_available():
            return f"torch {version} sees no CUDA device"
        return None
    try:
        count = module.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return f"cupy {version} cannot use CUDA: {exc}"
    return None if count > 0 else f"cupy {version} sees no CUDA device"


def cuda_devices(name, module):
    """[{index, uuid, pci_bus_id, name}] of every CUDA device. torch gives the uuid
    ("GPU-..." as NVML writes it); CuPy gives the PCI bus id instead (its uuid comes
    through a C string and is cut at the first zero byte), which decide() matches with
    NVML's."""
    devices = []
    if name == "torch":
        for index in range(module.cuda.device_count()):
            properties = module.cuda.get_device_properties(index)
            devices.append(
                {
                    "index": index,
                    "uuid": gpu_uuid_text(getattr(properties, "uuid", None)),
                    "pci_bus_id": None,
                    "name": properties.name,
                }
            )
    else:
        runtime = module.cuda.runtime
        for index in range(runtime.getDeviceCount()):
            device_name = runtime.getDeviceProperties(index).get("name", b"")
            if isinstance(device_name, bytes):
                device_name = device_name.decode(errors="replace")
            devices.append(
                {
                    "index": index,
                    "uuid": None,
                    "pci_bus_id": runtime.deviceGetPCIBusId(index),
                    "name": device_name,
                }
            )
    return devices


def gpu_uuid_text(raw):
    """torch's device uuid ("dd6ed4ff-be65-...") as NVML writes it: "GPU-dd6ed4ff-be65-...".
    None stays None."""
    if raw is None:
        return None
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def pci_address(bus_id):
    """A PCI bus id as numbers, to compare NVML's "00000000:00:06.0" with CUDA's
    "0000:00:06.0": (domain, bus, device, function), or None if it is not one."""
    try:
        domain, bus, rest = bus_id.split(":")
        device, function = rest.split(".")
        return tuple(int(part, 16) for part in (domain, bus, device, function))
    except (AttributeError, ValueError):
        return None


def elapsed_s(name, module, run, iterations):
    """Seconds the GPU took for `iterations` calls of run(), timed with CUDA events on
    the current device's current stream (so CPU launch time between them is hidden)."""
    if name == "torch":
        start = module.cuda.Event(enable_timing=True)
        end = module.cuda.Event(enable_timing=True)
    else:
        start = module.cuda.Event()
        end = module.cuda.Event()
    start.record()
    for _ in range(iterations):
        run()
    end.record()
    end.synchronize()
    if name == "torch":
        return start.elapsed_time(end) / 1000.0
    return module.cuda.get_elapsed_time(start, end) / 1000.0


def warm_up(name, module, run, times):
    """Calls run() `times` times and waits for the GPU, so that what is timed next leaves
    out the first calls' costs (kernel loading, the allocator growing)."""
    for _ in range(times):
        run()
    synchronize(name, module)


def measure_or_error(device, measure_one):
    """The device's dict with what measure_one() returns, or with "error" where it raises
    (a CUDA error on this GPU): the caller goes on to measure the other GPUs."""
    try:
        return {**device, **measure_one()}
    except Exception as exc:
        return {**device, "error": f"{type(exc).__name__}: {exc}"}


def synchronize(name, module):
    if name == "torch":
        module.cuda.synchronize()
    else:
        module.cuda.Device().synchronize()


def free_memory_bytes(name, module, index):
    if name == "torch":
        free, _total = module.cuda.mem_get_info(index)
        return free
    with module.cuda.Device(index):
        free, _total = module.cuda.runtime.memGetInfo()
        return free


def device_context(name, module, index):
    """A context manager making CUDA device `index` current."""
    if name == "torch":
        return module.cuda.device(index)
    return module.cuda.Device(index)


def release_memory(name, module):
    """Give the memory of freed arrays back to the driver, before the next GPU."""
    if name == "torch":
        module.cuda.empty_cache()
    else:
        module.get_default_memory_pool().free_all_blocks()
