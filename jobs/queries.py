"""The reads behind what other pages show of jobs."""

from .models import Job


def node_jobs_context(node, limit=20):
    """The node page's latest jobs that ran on the node."""
    return {"node_jobs": Job.objects.filter(cluster=node.cluster, job_nodes__node_name=node.name)
            .order_by("-start", "-id")[:limit]}
