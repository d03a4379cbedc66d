"""The driver's own verdict on a GPU: NVML's GPU recovery action (the field value
NVML_FI_DEV_GET_GPU_RECOVERY_ACTION, driver 570 and later; `nvidia-smi -q` shows it as
"GPU Recovery Action"), read every `interval_s` seconds (default 10) in a thread, NVML
backend only.

Any action other than NONE is a `gpu_recovery_action` event (critical) naming it
(GPU_RESET, NODE_REBOOT, DRAIN_P2P, DRAIN_AND_RESET, ... as pynvml's
NVML_GPU_RECOVERY_ACTION_* constants name them); a change to another action is another
event; back to NONE, a `cleared` event. The driver announces each change in the kernel
log too, as Xid 154 ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot
Required)"): that line becomes an `xid:154` event whose detail carries the action.

A driver without the field (its value answers NOT_SUPPORTED) is logged once per GPU and
not read again; a lost GPU neither (the backend reports it)."""

import logging

from agent.connection.protocol import event_frame
from agent.detectors.polling import PollingWatcher

log = logging.getLogger(__name__)

RECOVERY_ACTION_INTERVAL_S = 10.0
_ACTION_PREFIX = "NVML_GPU_RECOVERY_ACTION_"


def recovery_action_names(nvml):
    """{value: name} from pynvml's constants: {0: "NONE", 1: "GPU_RESET", ...}."""
    return {
        getattr(nvml, name): name[len(_ACTION_PREFIX) :]
        for name in dir(nvml)
        if name.startswith(_ACTION_PREFIX)
    }


def field_value(nvml, value):
    """The integer in a c_nvmlFieldValue_t, read by its valueType."""
    member = {
        nvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        nvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        nvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        nvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }[value.valueType]
    return getattr(value.value, member)


class RecoveryActionWatcher(PollingWatcher):
    thread_name = "gpu-recovery-action"

    def __init__(self, nvml, gpus, interval_s=RECOVERY_ACTION_INTERVAL_S):
        """nvml: the pynvml module; gpus: [(uuid, handle)]."""
        super().__init__(interval_s)
        self._nvml = nvml
        self._gpus = list(gpus)
        self._names = recovery_action_names(nvml)
        self._none = nvml.NVML_GPU_RECOVERY_ACTION_NONE
        self._actions = {}  # uuid -> the last action read
        self._warned = set()

    def check_once(self):
        events = []
        for uuid, handle in list(self._gpus):
            action = self._read(uuid, handle)
            if action is None:
                continue
            name = self._names.get(action, str(action))
            log.debug("%s: GPU recovery action %s", uuid, name)
            before = self._actions.get(uuid, self._none)
            self._actions[uuid] = action
            if action == before:
                continue
            if action != self._none:
                events.append(
                    event_frame(
                        signature="gpu_recovery_action",
                        severity="critical",
                        message=f"the driver asks for GPU recovery action {name}",
                        gpu_uuid=uuid,
                        detail={"action": action, "action_name": name},
                    )
                )
            else:
                events.append(
                    event_frame(
                        signature="gpu_recovery_action",
                        severity="info",
                        message="the driver asks for no GPU recovery action any more",
                        gpu_uuid=uuid,
                        detail={"action": action, "action_name": name},
                        state="cleared",
                    )
                )
        self.finished = not self._gpus
        return events

    def _read(self, uuid, handle):
        """The GPU's recovery action, or None (and the GPU dropped where it never will
        have one)."""
        nvml = self._nvml
        try:
            [value] = nvml.nvmlDeviceGetFieldValues(
                handle, [nvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
            )
        except nvml.NVMLError_GpuIsLost:
            self._gpus.remove((uuid, handle))
            return None
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            self._drop_unsupported(uuid, handle)
            return None
        except nvml.NVMLError as exc:
            self._warn_once(uuid, exc)
            return None
        if value.nvmlReturn == nvml.NVML_ERROR_NOT_SUPPORTED:
            self._drop_unsupported(uuid, handle)
            return None
        if value.nvmlReturn == nvml.NVML_ERROR_GPU_IS_LOST:
            self._gpus.remove((uuid, handle))
            return None
        if value.nvmlReturn != nvml.NVML_SUCCESS:
            self._warn_once(uuid, nvml.NVMLError(value.nvmlReturn))
            return None
        return field_value(nvml, value)

    def _drop_unsupported(self, uuid, handle):
        log.info("%s: this driver gives no GPU recovery action; not watched", uuid)
        self._gpus.remove((uuid, handle))

    def _warn_once(self, uuid, exc):
        if uuid not in self._warned:
            self._warned.add(uuid)
            log.warning("reading the GPU recovery action of %s failed: %s", uuid, exc)
