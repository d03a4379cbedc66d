from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from clusters.models import Cluster
from clusters.tests.factories import ClusterFactory
from jobs import services
from jobs.models import Job
from jobs.tasks import import_jobs
from schedulers import ExecutorError

FIXTURE = (Path(__file__).parent / "fixtures" / "sacct_finished.txt").read_text()

pytestmark = pytest.mark.django_db


@pytest.fixture
def sacct_calls(monkeypatch):
    calls = []

    def fake_sacct(slurm_conf, since, until):
        calls.append(slurm_conf)
        if slurm_conf == "/etc/slurm/broken.conf":
            raise ExecutorError("sacct exited with status 1: no such file")
        return FIXTURE

    monkeypatch.setattr(services, "run_sacct", fake_sacct)
    return calls


def test_the_beat_task_imports_only_slurm_clusters_with_their_slurm_conf(sacct_calls):
    slurm = ClusterFactory(slug="slurm-a")
    Cluster.objects.filter(pk=slurm.pk).update(scheduler="slurm",
                                               scheduler_config="/etc/slurm/a.conf")
    other = ClusterFactory(slug="k8s")
    Cluster.objects.filter(pk=other.pk).update(scheduler="kubernetes")
    assert import_jobs() == {"slurm-a": "8 new, 0 updated"}
    assert sacct_calls == ["/etc/slurm/a.conf"]
    assert Job.objects.filter(cluster=slurm).count() == 8
    assert not Job.objects.filter(cluster=other).exists()


def test_the_command_imports_one_cluster_and_fails_loudly(sacct_calls):
    good = ClusterFactory(slug="good")
    Cluster.objects.filter(pk=good.pk).update(scheduler="slurm", scheduler_config="")
    broken = ClusterFactory(slug="broken")
    Cluster.objects.filter(pk=broken.pk).update(scheduler="slurm",
                                                scheduler_config="/etc/slurm/broken.conf")
    call_command("import_jobs", "--cluster", "good")
    assert sacct_calls == [None]  # empty scheduler_config: sacct's default slurm.conf
    with pytest.raises(CommandError):
        call_command("import_jobs")
    with pytest.raises(CommandError):
        call_command("import_jobs", "--cluster", "nope")
