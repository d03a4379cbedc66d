#!/bin/bash
# Scratch prep: format and mount the node's local NVMe as /scratch at boot, world-writable
# with the sticky bit, as jobs expect. Idempotent: a mounted /scratch is left as it is.
set -euo pipefail
scratch_device=${SCRATCH_DEVICE:-/dev/nvme1n1}
if mountpoint -q /scratch; then
    echo "/scratch is already mounted"
elif [ ! -b "$scratch_device" ]; then
    echo "no scratch device $scratch_device: nothing to do"
else
    blkid "$scratch_device" >/dev/null 2>&1 || mkfs.xfs -f -L scratch "$scratch_device"
    mkdir -p /scratch
    mount -o noatime "$scratch_device" /scratch
    chmod 1777 /scratch
    echo "mounted $scratch_device on /scratch"
fi
