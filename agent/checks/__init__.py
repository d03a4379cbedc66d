"""Active checks: measurements the server asks for with `run_check` (shared/PROTOCOL.md),
answered with a `check_result` of status passed, failed or error.

The server sends the thresholds (from its baselines) as params; the check measures and
decides against them here, so the verdict is made in one place. Each check is a module
of this package with:

    PARAMS                  {name: params.Param}: what the check takes
    read_params(params)     the params with defaults, or ParamError naming one
    time_limit_s(params, gpu_count)   how long its child process may run
    measure(request)        runs in a child process: the raw measurements (a dict), or
                            CheckError with the reason it could not measure
    decide(measurements, params, inventory)   pure: the check_result's status, metrics
                            and message (no GPU needed to test it)

runner.CheckRunner runs measure() in a child process (`python -m agent.checks child
<module>`); a simulation has its own runner (agent/sim/checks.py). agent/README.md
lists the checks, their params, metrics and verdict rules.

Nothing here imports the agent's client (websockets), torch or CuPy at import time:
`python -m agent.checks run <check>` works on a node with only the standard library,
nvidia-ml-py and, for the compute checks, torch or CuPy."""

# check name -> the module that measures and decides it
CHECKS = {
    "gpu_compute": "agent.checks.gpu_compute",
    "gpu_memory_bandwidth": "agent.checks.gpu_memory_bandwidth",
    "nvml_sanity": "agent.checks.nvml_sanity",
    "storage": "agent.checks.storage",
    "nccl": "agent.checks.nccl",
}


class CheckError(Exception):
    """The check could not measure (no torch, no such path, ...): status `error`, with
    this message."""


def passed(metrics, message):
    return {"status": "passed", "metrics": metrics, "message": message}


def failed(metrics, problems):
    """A failed result listing every problem found, in order."""
    return {"status": "failed", "metrics": metrics, "message": "; ".join(problems)}


def error(message, metrics=None):
    return {"status": "error", "metrics": metrics or {}, "message": message}


def gpu_label(index, uuid):
    """How a message names a GPU: "GPU 3 (GPU-dd6e...)"."""
    if uuid is None:
        return f"GPU {index}"
    return f"GPU {index} ({uuid})"


def missing_from_inventory(inventory, seen_uuids):
    """The inventory's GPUs (the agent's GPUs at start) whose uuid is not in seen_uuids."""
    return [gpu for gpu in inventory if gpu["uuid"] not in seen_uuids]
