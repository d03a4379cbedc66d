import factory
from django.contrib.auth import get_user_model
from django.utils import timezone

from clusters.models import Cluster
from clusters.roles import assign_role


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"user{n}")
    password = factory.PostGenerationMethodCall("set_password", "password")

    @factory.post_generation
    def role(user, create, extracted, **kwargs):
        user.save()
        if extracted is not None:
            assign_role(user, extracted)


class ClusterFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Cluster

    name = factory.Sequence(lambda n: f"cluster-{n}")
    slug = factory.LazyAttribute(lambda c: c.name)
    region = "us-west-2"
    gpu_type = "NVIDIA H200"
    gpus_per_node = 8
    driver_version = "580.159.04"
    networking = "InfiniBand NDR 400 Gb/s"
    os_image = "Ubuntu 22.04"
    billing_rate_per_gpu_hour = "2.10"


def now():
    return timezone.now()
