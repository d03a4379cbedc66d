import csv

import pytest

from healthchecks.xid_catalog import (
    CRITICAL, INFO, REBOOT, REMOVE, WARNING, bucket_rules, catalog, generation_of, policy_for,
    why_sentence,
)


def test_the_whole_catalog_loads():
    rows = list(csv.DictReader(open("healthchecks/data/xid_catalog.tsv"), delimiter="\t"))
    assert len(catalog()) == len(rows) == 172
    assert catalog()[79].description == "GPU has fallen off the bus"
    assert catalog()[79].gpud_actions == ("REBOOT_SYSTEM", "HARDWARE_INSPECTION")
    assert catalog()[79].guidance == "Restart bare metal, system should be restarted"


@pytest.mark.parametrize("code, severity, recommendation", [
    (79, CRITICAL, REBOOT),  # RESTART_BM
    (119, CRITICAL, "reset_gpu"),  # RESET_GPU
    (48, CRITICAL, "reset_gpu"),  # WORKFLOW_XID_48
    (154, CRITICAL, REBOOT),  # XID_154
    (13, INFO, None),  # RESTART_APP: the application's problem
    (94, INFO, None),  # RESTART_APP
    (63, INFO, None),  # IGNORE
])
def test_buckets_map_as_design_says(code, severity, recommendation):
    policy = policy_for(code, "NVIDIA H200")
    assert (policy.severity, policy.recommendation) == (severity, recommendation)


def test_every_bucket_in_the_catalog_has_a_mapping():
    for code, entry in catalog().items():
        policy = policy_for(code, "NVIDIA H200")
        assert policy.severity in (INFO, WARNING, CRITICAL), (code, entry.bucket)
    buckets = {entry.bucket for entry in catalog().values()}
    assert {"UPDATE_SWFW", "CONTACT_SUPPORT", "CHECK_MECHANICALS", ""} <= buckets
    # Each bucket has its own row in xid_buckets.tsv: none falls to the "*" row.
    assert buckets <= set(bucket_rules()) - {"*"}


def test_xid_buckets_tsv_says_each_bucket_in_words():
    for bucket, rule in bucket_rules().items():
        assert rule.nvidia_says and rule.why, bucket
        assert rule.severity in (INFO, WARNING, CRITICAL), bucket
        assert bool(rule.ladder) == (rule.severity == CRITICAL), bucket


def test_the_why_of_an_xid_says_nvidias_action_in_words_and_where_gpud_differs():
    assert why_sentence(79, "NVIDIA H200") == (
        "NVIDIA: restart the machine (RESTART_BM), for A100, H100, B100, GB200-class GPUs. "
        "A reboot restarts the machine and reloads the driver; local data is kept.")
    # Xid 48's workflow is a sentence, not NVIDIA's whole cell.
    assert why_sentence(48, "NVIDIA H200").startswith(
        "NVIDIA: reset the GPU when the error comes alone; drain and reset it with Xid 63 or 64")
    assert "Investagatory" not in why_sentence(48, "NVIDIA H200")
    # Xid 32: NVIDIA says restart the application; gpud says reboot or inspect.
    assert why_sentence(32, "NVIDIA H200").endswith(
        "gpud differs: it suggests a reboot or a hardware inspection.")


def test_update_swfw_is_a_reprovision():
    (code,) = [c for c, e in catalog().items() if e.bucket == "UPDATE_SWFW"]
    assert policy_for(code, "NVIDIA H200").recommendation == "reprovision"


def test_a_blank_bucket_is_a_warning_without_guidance():
    code = next(c for c, e in catalog().items() if e.bucket == "")
    assert policy_for(code) == policy_for(code, "NVIDIA H200")
    assert (policy_for(code).severity, policy_for(code).recommendation) == (WARNING, None)
    assert policy_for(code).nvidia == "NVIDIA: no guidance (no bucket)"


def test_rma_only_for_codes_that_apply_to_the_gpu_model():
    # Xid 142 (CONTACT_SUPPORT) applies to GB200 only; Xid 54 (CHECK_MECHANICALS) to
    # A100, H100 and B100 but not GB200 (the catalog's applies_* columns).
    assert policy_for(142, "NVIDIA GB200").recommendation == REMOVE
    assert policy_for(142, "NVIDIA H200").recommendation is None
    assert policy_for(142, "NVIDIA H200").severity == WARNING
    assert policy_for(54, "NVIDIA H200").recommendation == REMOVE
    assert policy_for(54, "NVIDIA GB200").recommendation is None


def test_model_names_map_to_catalog_generations():
    assert generation_of("NVIDIA H200") == "applies_H100"
    assert generation_of("NVIDIA GB200") == "applies_GB200"
    assert generation_of("NVIDIA B200") == "applies_B100"
    assert generation_of("NVIDIA A100-SXM4-80GB") == "applies_A100"
    assert generation_of("Tesla T4") is None


def test_an_unknown_code_is_a_warning():
    assert policy_for(99999).severity == WARNING
