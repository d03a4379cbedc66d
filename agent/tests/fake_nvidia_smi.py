"""A stand-in for `nvidia-smi` in the GPU reset's tests: never run on a real GPU (resetting
one is not allowed on the lent device). It answers `--gpu-reset -i N` and `-i N -pm M` as
the real one does, in the words NVIDIA's tool prints (NVIDIA/NVSentinel#1690 and #1692:
"GPU 00000000:1A:00.0 was successfully reset." with exit 0; "The following GPUs could not be
reset: ... In use by another client" with exit 255), and records each call.

Its state is a JSON file named by FAKE_NVIDIA_SMI_STATE: {"in_use": bool (the reset finds
the GPU held), "calls": [argv, ...]}.

    python fake_nvidia_smi.py --gpu-reset -i 3
"""

import json
import os
import sys

BUS_IDS = "00000000:{:02X}:00.0"


def main(argv):
    path = os.environ["FAKE_NVIDIA_SMI_STATE"]
    with open(path) as f:
        state = json.load(f)
    state.setdefault("calls", []).append(argv)
    with open(path, "w") as f:
        json.dump(state, f)
    index = int(argv[argv.index("-i") + 1])
    bus_id = BUS_IDS.format(0x1A + index)
    if "-pm" in argv:
        mode = "Enabled" if argv[argv.index("-pm") + 1] == "1" else "Disabled"
        print(f"Persistence mode set to {mode} for GPU {bus_id}.\nAll done.")
        return 0
    if "--gpu-reset" in argv:
        if state.get("in_use"):
            print(f"The following GPUs could not be reset:\n  GPU {bus_id}: In use by another "
                  f"client\n\n1 device is currently being used by one or more other "
                  f"processes (e.g. Fabric Manager, CUDA application, graphics application "
                  f"such as an X server, or a monitoring application such as another "
                  f"instance of nvidia-smi). Please first kill all processes using this "
                  f"device and all compute applications running in the system.")
            return 255
        print(f"GPU {bus_id} was successfully reset.")
        return 0
    print(f"fake nvidia-smi: unsupported arguments {argv}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
