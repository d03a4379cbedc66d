"""gpu_memory_bandwidth: device-to-device copy throughput of each GPU's memory, one GPU
after the other.

Per GPU: a buffer of `bytes` copied into another on the same GPU (cudaMemcpyAsync,
through torch's copy_ or CuPy's runtime), three warm-up copies, then the timed copies
between two CUDA events. Each copy reads and writes `bytes`, so TB/s = 2 * bytes *
copies / seconds / 1e12. On an H200 a 4 GiB copy gives about 4.3 TB/s (8.6 GB moved in
2.0 ms)."""

from agent.checks import CheckError, cuda
from agent.checks.gpu_compute import decide_per_gpu
from agent.checks.params import Param
from agent.checks.params import read_params as read_spec

GiB = 2**30
MiB = 2**20
DEFAULT_BYTES = 4 * GiB
WARMUPS = 3
STARTUP_S = 120.0
PER_GPU_S = 30.0  # allocation and fill of each GPU's buffers
SLOWEST_TBPS = 0.2  # the time limit lets a GPU this slow finish (fail, not time out)
UNKNOWN_GPU_COUNT = 8

PARAMS = {
    "bytes": Param(
        "int",
        minimum=MiB,
        maximum=2**40,
        help="size of the copied buffer (default 4 GiB, or a quarter of the free memory)",
    ),
    "iterations": Param("int", default=20, minimum=1, maximum=10000, help="timed copies"),
    "min_tbps": Param("number", minimum=0, help="the least TB/s a GPU may give"),
    "backend": Param("string", choices=("torch", "cupy"), help="default: torch, else cupy"),
}


def read_params(params):
    return read_spec(params, PARAMS)


def time_limit_s(params, gpu_count):
    copy_s = 2 * (params["bytes"] or DEFAULT_BYTES) / (SLOWEST_TBPS * 1e12)
    per_gpu_s = PER_GPU_S + (WARMUPS + params["iterations"]) * copy_s
    return STARTUP_S + (gpu_count or UNKNOWN_GPU_COUNT) * per_gpu_s


def decide(measurements, params, inventory):
    """measurements: {"backend", "bytes", "gpus": [{index, uuid, name, tbps} or
    {index, uuid, name, error}]}."""
    return decide_per_gpu(
        measurements,
        inventory,
        value_key="tbps",
        unit="TB/s",
        minimum=params["min_tbps"],
        what="the copy",
        extra_metrics={"bytes": measurements["bytes"]},
    )


def buffer_bytes(wanted, free_bytes):
    """The buffer size for a GPU with free_bytes free: `wanted`, or by default 4 GiB but
    at most a quarter of the free memory (two buffers, and room for others' use).
    Raises CheckError when the two buffers of `wanted` bytes do not fit."""
    if wanted is None:
        return max(MiB, min(DEFAULT_BYTES, free_bytes // 4) // MiB * MiB)
    if 2 * wanted > free_bytes:
        raise CheckError(
            f"bytes={wanted} needs two buffers, {2 * wanted} bytes, but only "
            f"{free_bytes} bytes of GPU memory are free"
        )
    return wanted


# The child process


def measure(request):
    params = request["params"]
    library_name, library = cuda.pick_library(params["backend"])
    gpus = []
    sizes = set()
    for device in cuda.cuda_devices(library_name, library):
        index = device["index"]
        size = buffer_bytes(params["bytes"], cuda.free_memory_bytes(library_name, library, index))
        sizes.add(size)

        def measure_one(index=index, size=size):
            tbps = _measure_gpu(library_name, library, index, size, params["iterations"])
            return {"tbps": round(tbps, 3), "bytes": size}

        gpus.append(cuda.measure_or_error(device, measure_one))
    # by default each GPU's buffer follows its free memory: report the smallest
    return {"backend": library_name, "bytes": min(sizes) if sizes else None, "gpus": gpus}


def _measure_gpu(library_name, library, index, size, iterations):
    with cuda.device_context(library_name, library, index):
        if library_name == "torch":
            copy = _torch_copy(library, size)
        else:
            copy = _cupy_copy(library, size)
        cuda.warm_up(library_name, library, copy, WARMUPS)
        seconds = cuda.elapsed_s(library_name, library, copy, iterations)
        del copy
    cuda.release_memory(library_name, library)
    return 2 * size * iterations / seconds / 1e12


def _torch_copy(torch, size):
    source = torch.randint(0, 256, (size,), dtype=torch.uint8, device="cuda")
    target = torch.empty(size, dtype=torch.uint8, device="cuda")
    return lambda: target.copy_(source)


def _cupy_copy(cupy, size):
    # the bytes' values do not matter to a copy (memory from cudaMalloc is not compressed)
    source = cupy.empty(size, dtype=cupy.uint8)
    source.fill(0x5A)
    target = cupy.empty(size, dtype=cupy.uint8)
    runtime = cupy.cuda.runtime

    def copy():
        runtime.memcpyAsync(
            target.data.ptr,
            source.data.ptr,
            size,
            runtime.memcpyDeviceToDevice,
            cupy.cuda.get_current_stream().ptr,
        )

    return copy
