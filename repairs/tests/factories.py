import factory
from django.utils import timezone

from nodes.tests.factories import NodeFactory
from repairs.choices import Action, Status
from repairs.models import Repair


class RepairFactory(factory.django.DjangoModelFactory):
    """A repair with its status set directly: for tests of what reads or moves it."""

    class Meta:
        model = Repair

    node = factory.SubFactory(NodeFactory)
    cluster = factory.SelfAttribute("node.cluster")
    action = Action.REBOOT
    status = Status.PROPOSED
    signature = "xid:79"
    reason = "NVIDIA's catalog for Xid 79"
    requested_at = factory.LazyFunction(timezone.now)
