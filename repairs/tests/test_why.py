"""Every recommendation explains itself from data, in words: each signature of the catalog,
each check and each Xid (by NVIDIA's bucket, for each GPU class) has a why sentence, and no
page or answer says "the default for"."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from healthchecks.check_catalog import CHECKS
from healthchecks.queries import held_signal_text
from healthchecks.services import do_record_health_event
from healthchecks.signatures import SIGNATURES
from healthchecks.xid_catalog import catalog
from nodes.models import NodeRollup
from nodes.tests.factories import GpuFactory, NodeFactory
from repairs.policy import default_ladder
from repairs.services import refresh_recommendation

pytestmark = pytest.mark.django_db

MODELS = ("NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA GB200", "")


def every_signature():
    named = [name for name in SIGNATURES if "<" not in name]
    return [*named, *(f"check:{name}" for name in CHECKS),
            *(f"xid:{code}" for code in sorted(catalog())), "xid:99999", "no_such_signal"]


@pytest.mark.parametrize("model", MODELS)
def test_every_signature_and_every_xid_has_a_why_sentence(model):
    for signature in every_signature():
        ladder = default_ladder(signature, model)
        assert ladder.why.endswith("."), (signature, ladder.why)
        assert len(ladder.why) > 40, (signature, ladder.why)
        assert "the default for" not in ladder.why
        if signature.startswith("check:"):  # the catalog's {name} is the check's own
            assert signature.removeprefix("check:") in ladder.why, ladder.why
        if len(ladder.actions) and ladder.lighter:
            assert ladder.lighter.endswith("."), signature


def test_the_policy_page_shows_each_why_and_never_the_default_for(client_for, viewer, cluster):
    page = client_for(viewer).get(reverse("repairs:settings", args=[cluster.slug])).text
    assert "the default for" not in page
    assert "The clean-up ends the processes that still hold GPU memory" in page
    assert "NVIDIA: restart the machine (RESTART_BM)" in page
    assert "Investagatory" not in page  # NVIDIA's raw workflow cell is not pasted inline


def test_a_card_for_each_signature_with_a_ladder_says_why(client_for, viewer, cluster):
    signatures = [name for name in every_signature()
                  if default_ladder(name, "NVIDIA H200").actions
                  and name not in ("thermal_throttle", "power_brake", "hw_slowdown")]
    for number, signature in enumerate(signatures):
        node = NodeFactory(cluster=cluster, name=f"gpu-{number:03d}")
        gpu = GpuFactory(node=node, index=0, name="NVIDIA H200")
        do_record_health_event(node, signature=signature, severity="critical", gpu=gpu,
                               message=signature)
        repair = refresh_recommendation(node)
        assert repair is not None, signature
        assert "the default for" not in repair.reason
    page = client_for(viewer).get(reverse("repairs:list", args=[cluster.slug])).text
    assert "the default for" not in page and page.count('class="why"') >= len(signatures)


def test_a_held_signal_shows_how_long_it_has_been_held_and_its_peak(cluster):
    now = timezone.now().replace(second=30, microsecond=0)
    node = NodeFactory(cluster=cluster)
    gpu = GpuFactory(node=node, index=4, uuid="GPU-4")
    event = do_record_health_event(node, signature="thermal_throttle", severity="warning",
                                   gpu=gpu, message="thermal slowdown held for 60 s",
                                   evidence={"temp_c": 84}, now=now - timedelta(minutes=16))
    for minute, hottest in ((15, 86), (8, 88), (1, 87)):
        NodeRollup.objects.create(node=node, minute=(now - timedelta(minutes=minute)).replace(
            second=0), gpus={"GPU-4": {"temp_c": [80, hottest]}, "GPU-5": {"temp_c": [90, 95]}})
    assert held_signal_text(event, now) == "held 16 min, up to 88 °C"
    xid = do_record_health_event(node, signature="xid:79", severity="critical", gpu=gpu,
                                 message="fallen off the bus", now=now)
    assert held_signal_text(xid, now) == ""  # an edge signal is not held
