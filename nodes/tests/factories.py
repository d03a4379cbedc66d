import factory
from django.utils import timezone

from clusters.tests.factories import ClusterFactory
from nodes.choices import NodeState
from nodes.models import Gpu, Node, NodeTransition


class NodeFactory(factory.django.DjangoModelFactory):
    """A node with its state set directly: for read-side tests only (services compute it)."""

    class Meta:
        model = Node

    cluster = factory.SubFactory(ClusterFactory)
    name = factory.Sequence(lambda n: f"gpu-{n:04d}")
    hostname = factory.LazyAttribute(lambda n: f"{n.name}.internal")
    state = NodeState.HEALTHY
    joined_at = factory.LazyFunction(timezone.now)
    last_hello_at = factory.LazyFunction(timezone.now)
    last_seen = factory.LazyFunction(timezone.now)
    boot_id = "4f1c6d2e-0b1a-4c55-9e1e-6f3b2a1d0c9e"


class GpuFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Gpu

    node = factory.SubFactory(NodeFactory)
    index = factory.Sequence(lambda n: n % 8)
    uuid = factory.Sequence(lambda n: f"GPU-{n:08x}-0000-0000-0000-000000000000")
    name = "NVIDIA H200"
    pci_bus_id = factory.LazyAttribute(lambda g: f"00000000:{g.index + 6:02X}:00.0")
    memory_total_bytes = 150754820096


class NodeTransitionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = NodeTransition

    node = factory.SubFactory(NodeFactory)
    cluster = factory.SelfAttribute("node.cluster")
    from_state = NodeState.HEALTHY
    to_state = NodeState.UNHEALTHY
    reason = "xid:79 on GPU 3"
    actor_name = "system"
    at = factory.LazyFunction(timezone.now)
