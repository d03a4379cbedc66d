"""gpu_compute: bf16 matrix product throughput of each GPU, one GPU after the other.

Per GPU: two random size x size bf16 matrices, three warm-up products, then the timed
products between two CUDA events; TFLOP/s = 2 * size^3 * products / seconds. On an
H200 this gives about 788 TFLOP/s for size 8192 (random data; zeros run faster, since
the tensor cores draw less power on them)."""

import math

from agent.checks import (
    cuda,
    error,
    failed,
    gpu_label,
    missing_from_inventory,
    passed,
)
from agent.checks.params import Param, ParamError
from agent.checks.params import read_params as read_spec

WARMUPS = 3
DEFAULT_ITERATIONS = 10
CALIBRATION_PRODUCTS = 3  # timed to turn `seconds` into a number of products
STARTUP_S = 120.0  # importing torch and a CUDA context per GPU: slow on a cold node
PER_GPU_S = 30.0  # allocation and random fill of each GPU's matrices
SLOWEST_TFLOPS = 20.0  # the time limit lets a GPU this slow finish (fail, not time out)
UNKNOWN_GPU_COUNT = 8  # for the time limit, when the agent could not list the GPUs

PARAMS = {
    "size": Param("int", default=8192, minimum=256, maximum=32768, help="matrix side"),
    "iterations": Param("int", minimum=1, maximum=100000, help="timed products per GPU"),
    "seconds": Param("number", minimum=0.1, maximum=600, help="time the products per GPU"),
    "min_tflops": Param("number", minimum=0, help="the least TFLOP/s a GPU may give"),
    "backend": Param("string", choices=("torch", "cupy"), help="default: torch, else cupy"),
}


def read_params(params):
    values = read_spec(params, PARAMS)
    if values["iterations"] is not None and values["seconds"] is not None:
        raise ParamError("iterations, seconds: give one of them, not both")
    if values["seconds"] is None and values["iterations"] is None:
        values["iterations"] = DEFAULT_ITERATIONS
    return values


def product_seconds_at_slowest(size):
    return 2 * size**3 / (SLOWEST_TFLOPS * 1e12)


def time_limit_s(params, gpu_count):
    product_s = product_seconds_at_slowest(params["size"])
    if params["seconds"] is not None:
        timed_s = params["seconds"] + CALIBRATION_PRODUCTS * product_s
    else:
        timed_s = params["iterations"] * product_s
    per_gpu_s = PER_GPU_S + WARMUPS * product_s + timed_s
    return STARTUP_S + (gpu_count or UNKNOWN_GPU_COUNT) * per_gpu_s


def decide(measurements, params, inventory):
    """measurements: {"backend", "size", "gpus": [{index, uuid, name, tflops} or
    {index, uuid, name, error}]}; inventory: the agent's GPUs [{index, uuid, ...}]."""
    return decide_per_gpu(
        measurements,
        inventory,
        value_key="tflops",
        unit="TFLOP/s",
        minimum=params["min_tflops"],
        what="the matrix product",
        extra_metrics={"size": measurements["size"]},
    )


def decide_per_gpu(measurements, inventory, *, value_key, unit, minimum, what, extra_metrics):
    """The verdict of a per-GPU measurement (gpu_compute, gpu_memory_bandwidth): failed
    when a GPU is below `minimum`, failed on a GPU that could not be measured or that
    the library does not see; metrics[value_key] is the lowest GPU's value."""
    library = measurements["backend"]
    gpus = sorted(
        (with_nvml_uuid(gpu, inventory) for gpu in measurements["gpus"]),
        key=lambda gpu: gpu["index"],
    )
    metrics = {value_key: None, "gpus": {}, "backend": library, **extra_metrics}
    if not gpus:
        return error(f"{library} sees no CUDA device to measure", metrics)

    problems = []
    measured = []
    for gpu in gpus:
        key = gpu["uuid"] or f"cuda:{gpu['index']}"
        if "error" in gpu:
            metrics["gpus"][key] = {"index": gpu["index"], "error": gpu["error"]}
            label = gpu_label(gpu["index"], gpu["uuid"])
            problems.append(f"{label}: {what} failed: {gpu['error']}")
        else:
            metrics["gpus"][key] = {"index": gpu["index"], value_key: gpu[value_key]}
            measured.append(gpu)
    if measured:
        metrics[value_key] = min(gpu[value_key] for gpu in measured)

    seen = {gpu["uuid"] for gpu in gpus}
    if None in seen:  # the library gives no uuids: compare the counts
        if len(gpus) < len(inventory):
            problems.append(f"{library} sees {len(gpus)} GPUs, NVML lists {len(inventory)}")
    else:
        for gpu in missing_from_inventory(inventory, seen):
            problems.append(
                f"{gpu_label(gpu['index'], gpu['uuid'])}: not measured, {library} does not see it"
            )

    if minimum is not None:
        for gpu in measured:
            if gpu[value_key] < minimum:
                problems.append(
                    f"{gpu_label(gpu['index'], gpu['uuid'])}: {gpu[value_key]:g} {unit}, "
                    f"below the minimum {minimum:g}"
                )
    if problems:
        return failed(metrics, problems)
    if minimum is None:
        return passed(metrics, "measured; no baseline given")
    lowest = min(measured, key=lambda gpu: gpu[value_key])
    return passed(
        metrics,
        f"{len(measured)} GPUs at or above {minimum:g} {unit}; lowest "
        f"{lowest[value_key]:g} on {gpu_label(lowest['index'], lowest['uuid'])}",
    )


def with_nvml_uuid(gpu, inventory):
    """A measured GPU with the uuid of the inventory's GPU at the same PCI address,
    where the library gave a bus id and no uuid (CuPy)."""
    if gpu.get("uuid") or not gpu.get("pci_bus_id"):
        return gpu
    address = cuda.pci_address(gpu["pci_bus_id"])
    for known in inventory:
        if address is not None and cuda.pci_address(known.get("pci_bus_id")) == address:
            return {**gpu, "uuid": known["uuid"]}
    return gpu


# The child process


def measure(request):
    params = request["params"]
    library_name, library = cuda.pick_library(params["backend"])
    size = params["size"]
    gpus = []
    for device in cuda.cuda_devices(library_name, library):

        def measure_one(index=device["index"]):
            tflops, iterations = _measure_gpu(library_name, library, index, size, params)
            return {"tflops": round(tflops, 1), "iterations": iterations}

        gpus.append(cuda.measure_or_error(device, measure_one))
    return {"backend": library_name, "size": size, "gpus": gpus}


def _measure_gpu(library_name, library, index, size, params):
    with cuda.device_context(library_name, library, index):
        if library_name == "torch":
            product = _torch_product(library, size)
        else:
            product = _cupy_product(library, size)
        cuda.warm_up(library_name, library, product, WARMUPS)
        iterations = params["iterations"]
        if iterations is None:
            one_s = (
                cuda.elapsed_s(library_name, library, product, CALIBRATION_PRODUCTS)
                / CALIBRATION_PRODUCTS
            )
            iterations = max(1, math.ceil(params["seconds"] / one_s))
        seconds = cuda.elapsed_s(library_name, library, product, iterations)
        del product
    cuda.release_memory(library_name, library)
    return 2 * size**3 * iterations / seconds / 1e12, iterations


def _torch_product(torch, size):
    a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
    c = torch.empty(size, size, dtype=torch.bfloat16, device="cuda")
    return lambda: torch.matmul(a, b, out=c)


# Values from the CUDA and cuBLAS headers (cudaDataType_t, cublasOperation_t,
# cublasPointerMode_t, cublasComputeType_t, cublasGemmAlgo_t). CuPy has no bf16 array
# type, so the product calls cuBLAS directly on arrays of 16-bit words.
CUDA_R_16BF = 14
CUBLAS_OP_N = 0
CUBLAS_POINTER_MODE_HOST = 0
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1


def _cupy_product(cupy, size):
    import numpy
    from cupy_backends.cuda.libs import cublas

    def random_bf16():
        # bf16 is the top half of a float32: truncate normal float32 values
        values = cupy.random.standard_normal((size, size), dtype=cupy.float32)
        return (values.view(cupy.uint32) >> 16).astype(cupy.uint16)

    a, b = random_bf16(), random_bf16()
    c = cupy.empty((size, size), dtype=cupy.uint16)
    one = numpy.array(1.0, dtype=numpy.float32)
    zero = numpy.array(0.0, dtype=numpy.float32)
    handle = cupy.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, CUBLAS_POINTER_MODE_HOST)

    def product():
        cublas.gemmEx(
            handle, CUBLAS_OP_N, CUBLAS_OP_N, size, size, size,
            one.ctypes.data, a.data.ptr, CUDA_R_16BF, size,
            b.data.ptr, CUDA_R_16BF, size,
            zero.ctypes.data, c.data.ptr, CUDA_R_16BF, size,
            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT,
        )  # fmt: skip

    return product
