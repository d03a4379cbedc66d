"""nvml_sanity: what NVML says about each GPU's health, read once.

Per GPU: present (the count, and every GPU the agent had at its start), ECC enabled
(the current mode; a pending mode of off is a problem too, since it takes effect at
the next reset), the PCIe link, and row remapping (no remapping failure, no remap
pending).

PCIe: the link generation and width compared with `pcie_gen` / `pcie_width` are the
*maximum* ones, nvmlDeviceGetMaxPcieLinkGeneration / nvmlDeviceGetMaxPcieLinkWidth:
the most the GPU and the slot it sits in can do together (nvidia-smi -q "PCIe
Generation Max" / "Link Width Max"). The *current* generation
(nvmlDeviceGetCurrPcieLinkGeneration) drops to gen 1 while a GPU idles, to save power,
so comparing it would fail healthy idle GPUs; it is reported in the metrics, with the
current width, but not judged. So this finds a GPU in a slower slot or behind a slower
switch; a link that trains below its maximum under load is not caught here."""

from agent.checks import CheckError, failed, gpu_label, missing_from_inventory, passed
from agent.checks.params import Param
from agent.checks.params import read_params as read_spec

PARAMS = {
    "expected_gpus": Param("int", minimum=0, maximum=1024, help="how many GPUs NVML must list"),
    "pcie_gen": Param("int", minimum=1, maximum=7, help="the least max PCIe link generation"),
    "pcie_width": Param("int", minimum=1, maximum=32, help="the least max PCIe link width"),
}
TIME_LIMIT_S = 60.0


def read_params(params):
    return read_spec(params, PARAMS)


def time_limit_s(params, gpu_count):
    return TIME_LIMIT_S


def decide(measurements, params, inventory):
    """measurements: {"gpu_count", "gpus": [read_gpu(...) for each index]}."""
    count = measurements["gpu_count"]
    gpus = measurements["gpus"]
    problems = []
    if params["expected_gpus"] is not None and count != params["expected_gpus"]:
        problems.append(f"NVML lists {count} GPUs, expected {params['expected_gpus']}")
    elif count == 0:
        problems.append("NVML lists no GPUs")
    # A GPU NVML lists but cannot read (lost) keeps its index: it is named with the
    # uuid the agent knew there, and reported as unreadable rather than missing.
    unreadable = {gpu["index"] for gpu in gpus if gpu.get("uuid") is None}
    known_uuid = {gpu["index"]: gpu["uuid"] for gpu in inventory}
    for gpu in missing_from_inventory(inventory, {gpu.get("uuid") for gpu in gpus}):
        if gpu["index"] not in unreadable:
            problems.append(
                f"{gpu_label(gpu['index'], gpu['uuid'])}: present when the agent started, "
                f"now missing"
            )
    metrics = {"gpu_count": count, "gpus": {}}
    for gpu in gpus:
        key = gpu.get("uuid") or f"index:{gpu['index']}"
        metrics["gpus"][key] = {name: value for name, value in gpu.items() if name != "uuid"}
        problems += _gpu_problems(gpu, params, gpu.get("uuid") or known_uuid.get(gpu["index"]))
    if problems:
        return failed(metrics, problems)
    checked = ["ECC on", "no row remapping failure or pending remap"]
    link = []
    if params["pcie_gen"] is not None:
        link.append(f"gen {params['pcie_gen']}")
    if params["pcie_width"] is not None:
        link.append(f"x{params['pcie_width']}")
    if link:
        checked.insert(1, f"PCIe max link at least {' '.join(link)}")
    return passed(metrics, f"{count} GPUs: {', '.join(checked)}")


def _gpu_problems(gpu, params, uuid):
    label = gpu_label(gpu["index"], uuid)
    errors = gpu["errors"]
    unreadable = errors.get("handle") or errors.get("uuid")
    if unreadable:
        return [f"{label}: cannot be read: {unreadable}"]
    problems = []
    if gpu["ecc_mode_current"] is None:
        problems.append(f"{label}: ECC mode cannot be read: {errors.get('ecc_mode')}")
    elif not gpu["ecc_mode_current"]:
        problems.append(f"{label}: ECC is disabled")
    elif gpu["ecc_mode_pending"] is False:
        problems.append(f"{label}: ECC is set to turn off at the next reset")
    for field, wanted, what, prefix in (
        ("pcie_max_link_gen", params["pcie_gen"], "PCIe max link generation", "gen "),
        ("pcie_max_link_width", params["pcie_width"], "PCIe max link width", "x"),
    ):
        if wanted is None:
            continue
        if gpu[field] is None:
            problems.append(f"{label}: {what} cannot be read: {errors.get(field)}")
        elif gpu[field] < wanted:
            problems.append(f"{label}: {what} is {prefix}{gpu[field]}, expected {prefix}{wanted}")
    if gpu["remap_failure"]:
        problems.append(f"{label}: a row remapping failure occurred")
    if gpu["remap_pending"]:
        problems.append(f"{label}: a row remap is pending (reset the GPU to apply it)")
    return problems


# The child process (or a test, with a fake pynvml)


def measure(request, nvml=None):
    if nvml is None:
        try:
            import pynvml as nvml
        except ImportError as exc:
            raise CheckError(f"nvidia-ml-py (pynvml) cannot be imported: {exc}") from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise CheckError(f"NVML cannot start: {exc}") from exc
    try:
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            raise CheckError(f"NVML cannot count the GPUs: {exc}") from exc
        return {"gpu_count": count, "gpus": [read_gpu(nvml, index) for index in range(count)]}
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


def read_gpu(nvml, index):
    """The values one GPU's checks use; None where NVML refused, with its reason in
    "errors" (e.g. {"remapped_rows": "Not Supported"})."""
    gpu = {"index": index, "errors": {}}
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as exc:
        gpu["errors"]["handle"] = str(exc)
        return gpu

    def read(field, getter):
        try:
            return getter(handle)
        except nvml.NVMLError as exc:
            gpu["errors"][field] = str(exc)
            return None

    gpu["uuid"] = _text(read("uuid", nvml.nvmlDeviceGetUUID))
    if gpu["uuid"] is None:  # lost, or not answering: nothing more will be read
        return gpu
    gpu["name"] = _text(read("name", nvml.nvmlDeviceGetName))
    ecc = read("ecc_mode", nvml.nvmlDeviceGetEccMode)  # [current, pending]
    gpu["ecc_mode_current"] = None if ecc is None else ecc[0] == nvml.NVML_FEATURE_ENABLED
    gpu["ecc_mode_pending"] = None if ecc is None else ecc[1] == nvml.NVML_FEATURE_ENABLED
    gpu["pcie_max_link_gen"] = read("pcie_max_link_gen", nvml.nvmlDeviceGetMaxPcieLinkGeneration)
    gpu["pcie_max_link_width"] = read("pcie_max_link_width", nvml.nvmlDeviceGetMaxPcieLinkWidth)
    gpu["pcie_link_gen"] = read("pcie_link_gen", nvml.nvmlDeviceGetCurrPcieLinkGeneration)
    gpu["pcie_link_width"] = read("pcie_link_width", nvml.nvmlDeviceGetCurrPcieLinkWidth)
    # (correctable rows, uncorrectable rows, remap pending, remapping failure occurred);
    # GPUs before Ampere do not remap rows: None, and nothing to judge
    rows = read("remapped_rows", nvml.nvmlDeviceGetRemappedRows)
    gpu["remapped_rows_correctable"] = None if rows is None else rows[0]
    gpu["remapped_rows_uncorrectable"] = None if rows is None else rows[1]
    gpu["remap_pending"] = None if rows is None else bool(rows[2])
    gpu["remap_failure"] = None if rows is None else bool(rows[3])
    return gpu


def _text(value):
    return value.decode() if isinstance(value, bytes) else value
