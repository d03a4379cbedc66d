"""A node's GPU inventory (its Gpu rows not removed) against the GPUs of its latest hello.

DESIGN.md: a GPU of the inventory missing from a hello opens `gpu_lost` (server-side); a new
inventory (a replaced GPU) is accepted by the verify step of a repair or by an operator,
which closes it. Until then the inventory only grows by itself: a hello's new GPU at a free
index joins it, one at an index another GPU holds (a replacement) waits to be accepted.
"""

import hashlib
import json
from dataclasses import dataclass

GPU_LOST = "gpu_lost"
# The evidence key of a gpu_lost this rule opened (the agent opens gpu_lost too, from NVML).
MISSING_FROM_HELLO = "missing_from_hello"


def hello_gpu(gpu):
    """One GPU of a hello, with the fields the inventory keeps."""
    return {
        "index": gpu["index"],
        "uuid": gpu["uuid"],
        "name": gpu.get("name") or "",
        "pci_bus_id": gpu.get("pci_bus_id") or "",
        "memory_total_bytes": gpu.get("memory_total_bytes"),
    }


def hello_digest(*, agent_version, gpus, slurm):
    """What of a hello is stored on its node (agent version, GPUs with serials, Slurm state),
    as one string: a later hello with the same digest and boot id changes nothing
    (gateway/known_hello.py)."""
    content = [agent_version, list(gpus), ((slurm or {}).get("state") or "")[:64]]
    text = json.dumps(content, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def inventory_gpu(gpu):
    """A Gpu row in the same shape as hello_gpu()."""
    return {
        "index": gpu.index,
        "uuid": gpu.uuid,
        "name": gpu.name,
        "pci_bus_id": gpu.pci_bus_id,
        "memory_total_bytes": gpu.memory_total_bytes,
    }


def gpu_list(gpus):
    """[{index, uuid}] of hello GPUs or Gpu rows, by index: the evidence of a gpu_lost."""
    rows = [gpu if isinstance(gpu, dict) else inventory_gpu(gpu) for gpu in gpus]
    return [{"index": gpu["index"], "uuid": gpu["uuid"]} for gpu in sorted(
        rows, key=lambda gpu: gpu["index"])]


@dataclass(frozen=True)
class InventoryDifference:
    """What accepting the latest hello would change in the inventory."""

    missing: tuple = ()  # Gpu rows absent from the hello: they leave the inventory
    waiting: tuple = ()  # hello GPUs the inventory lacks (a replacement): they join it
    changed: tuple = ()  # (Gpu row, hello GPU) of a GPU whose index, model or bus moved

    def __bool__(self):
        return bool(self.missing or self.waiting or self.changed)

    def for_audit(self):
        return {
            "removed": gpu_list(self.missing),
            "added": gpu_list(self.waiting),
            "changed": [{"uuid": gpu.uuid, "before": inventory_gpu(gpu), "after": seen}
                        for gpu, seen in self.changed],
        }


def inventory_difference(inventory, hello_gpus):
    """The difference between Gpu rows in the inventory and a hello's GPU list."""
    in_hello = {gpu["uuid"]: hello_gpu(gpu) for gpu in hello_gpus}
    known = {gpu.uuid for gpu in inventory}
    return InventoryDifference(
        missing=tuple(gpu for gpu in inventory if gpu.uuid not in in_hello),
        waiting=tuple(gpu for uuid, gpu in in_hello.items() if uuid not in known),
        changed=tuple((gpu, in_hello[gpu.uuid]) for gpu in inventory
                      if gpu.uuid in in_hello and inventory_gpu(gpu) != in_hello[gpu.uuid]),
    )


def hello_problem(hello_gpus):
    """Why a hello's GPU list cannot become an inventory, or ''."""
    if hello_gpus is None:
        return "no hello with a GPU list has been recorded yet"
    if len({gpu["index"] for gpu in hello_gpus}) != len(hello_gpus):
        return "the latest hello lists a GPU index twice"
    if len({gpu["uuid"] for gpu in hello_gpus}) != len(hello_gpus):
        return "the latest hello lists a GPU UUID twice"
    return ""


@dataclass(frozen=True)
class InventoryReview:
    """What an operator sees before accepting the latest hello as the inventory."""

    difference: InventoryDifference
    gpu_lost: tuple = ()  # the open gpu_lost events accepting closes
    problem: str = ""  # why the latest hello cannot be accepted

    @property
    def acceptable(self):
        return not self.problem and bool(self.difference or self.gpu_lost)
