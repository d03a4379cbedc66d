import factory
from django.utils import timezone

from clusters.tests.factories import ClusterFactory
from jobs.models import Job, JobNode


class JobFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Job
        skip_postgeneration_save = True

    cluster = factory.SubFactory(ClusterFactory)
    job_id = factory.Sequence(lambda n: str(1000 + n))
    name = "train"
    user = "alice"
    account = "research"
    partition = "gpu"
    node_list = "gpu-001"
    gpus = 1
    start = factory.LazyFunction(timezone.now)
    end = None
    state = "RUNNING"
    exit_code = "0:0"

    @factory.post_generation
    def nodes(job, create, names, **kwargs):
        for name in names if names is not None else [job.node_list]:
            JobNode.objects.create(job=job, node_name=name)
