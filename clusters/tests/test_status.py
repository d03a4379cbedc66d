import pytest

from clusters.models import Cluster
from clusters.status import ClusterFacts, compute_status

Status = Cluster.Status

EVERYTHING = dict(pause_reason="datacenter move", nodes=64, joined=0, acceptance_on=True,
                  to_accept=0, accepted=0, out_of_service=64)


@pytest.mark.parametrize(
    "facts, status",
    [
        # DESIGN.md "Cluster status": the first that holds wins, whatever holds below it.
        (EVERYTHING, Status.PAUSED),
        ({**EVERYTHING, "pause_reason": ""}, Status.PROVISIONING),
        ({**EVERYTHING, "pause_reason": "", "joined": 10, "to_accept": 10, "accepted": 9},
         Status.ACCEPTING),
        ({**EVERYTHING, "pause_reason": "", "joined": 10, "to_accept": 10, "accepted": 10},
         Status.DEGRADED),
        (dict(nodes=10, joined=10, acceptance_on=False, to_accept=10, accepted=0,
              out_of_service=9), Status.DEGRADED),  # acceptance off: its nodes hold nothing
        (dict(nodes=10, joined=10, out_of_service=1), Status.READY),  # 10 % is not over 10 %
        (dict(nodes=10, joined=10, out_of_service=2), Status.DEGRADED),
        (dict(nodes=10, joined=3), Status.READY),
        (dict(), Status.PROVISIONING),
    ],
)
def test_it_applies_the_precedence(facts, status):
    assert compute_status(ClusterFacts(**facts), degraded_threshold_pct=10)[0] == status


def test_the_reason_says_why():
    assert compute_status(ClusterFacts(pause_reason="datacenter move"), 10) == (
        Status.PAUSED, "maintenance: datacenter move")
    assert compute_status(ClusterFacts(nodes=4), 10) == (
        Status.PROVISIONING, "no node has joined yet (4 registered)")
    assert compute_status(ClusterFacts(nodes=8, joined=8, acceptance_on=True, to_accept=8,
                                       accepted=5), 10) == (
        Status.ACCEPTING, "5 of 8 joined nodes passed acceptance")
    assert compute_status(ClusterFacts(nodes=8, joined=8, out_of_service=3), 25) == (
        Status.DEGRADED, "3 of 8 nodes out of service, over the 25 % threshold")
    assert compute_status(ClusterFacts(nodes=8, joined=8), 10) == (Status.READY, "")
