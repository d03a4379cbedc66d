#!/bin/bash
# Monitoring agent: make sure the node's metrics exporter runs after boot (Prometheus'
# node_exporter as a systemd unit; no dcgm-exporter is needed: clusterui's /metrics carries
# the GPU series).
set -euo pipefail
monitoring_unit=${MONITORING_UNIT:-prometheus-node-exporter}
systemctl enable --now "$monitoring_unit"
systemctl is-active "$monitoring_unit"
