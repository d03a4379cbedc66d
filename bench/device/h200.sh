#!/bin/bash
# The agent on a real NVIDIA GPU, in one pass (a few minutes): what only a GPU proves.
#
#   device run, from the repo root, carrying .whl (websockets for python3 there):
#     bash bench/device/h200.sh
#
# Writes each step's output to $OUT (or ./device-out) and prints a summary. Uses the
# machine's python3 (torch, cupy and nvidia-ml-py there); installs the agent's only
# missing requirement, websockets, from the carried wheel.
set -u
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/websockets-*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/websockets-*.whl \
        && export PYTHONPATH=/tmp/site
fi

step() {  # step NAME TIMEOUT_S COMMAND...
    local name=$1 limit=$2
    shift 2
    echo "== $name"
    timeout "$limit" "$@" >"$OUT/$name.txt" 2>&1
    echo "   exit $? ($(wc -l <"$OUT/$name.txt") lines): $(tail -n 1 "$OUT/$name.txt" | cut -c1-200)"
}

step nvidia-smi 30 nvidia-smi -q
step print-once 60 python3 -m agent --print-once
step checks-list 30 python3 -m agent.checks list
step nvml_sanity 120 python3 -m agent.checks run nvml_sanity --params '{"expected_gpus": 1, "pcie_gen": 5, "pcie_width": 16}'
step gpu_compute 300 python3 -m agent.checks run gpu_compute --params '{"min_tflops": 709.2}'
step gpu_compute-cupy 300 python3 -m agent.checks run gpu_compute --params '{"min_tflops": 709.2, "backend": "cupy"}'
step gpu_memory_bandwidth 300 python3 -m agent.checks run gpu_memory_bandwidth --params '{"min_tbps": 3.87}'
step gpu_memory_bandwidth-cupy 300 python3 -m agent.checks run gpu_memory_bandwidth --params '{"min_tbps": 3.87, "backend": "cupy"}'
step storage 300 python3 -m agent.checks run storage --params '{"path": "/tmp", "bytes": 1073741824}'
step nccl 60 python3 -m agent.checks run nccl
# The passive detectors on real NVML for 40 s, a bf16 matmul load in the middle of it.
step detectors 120 python3 bench/device/watch.py --seconds 40 --load-from 10 --load-for 20
step agent-cpu 150 python3 bench/agent_cpu.py --nvml --seconds 60
# Node hygiene: minor numbers, and a job's GPU memory as NVML's compute processes show it.
step hygiene 120 python3 bench/device/hygiene.py
echo "outputs in $OUT"
