"""The startup scripts' library: examples an admin starts a cluster with (the creation
page), each for one event and role, kept as files in startup/library/."""

from dataclasses import dataclass
from pathlib import Path

from nodes.choices import NodeRole

from .models import ScriptEvent as Event

LIBRARY_DIR = Path(__file__).parent / "library"


@dataclass(frozen=True)
class Example:
    key: str
    title: str
    what: str
    event: str
    role: str

    def body(self):
        return (LIBRARY_DIR / f"{self.key}.sh").read_text()


EXAMPLES = (
    Example("scratch-prep", "Scratch prep", "formats and mounts the local NVMe as /scratch "
            "at boot", Event.NODE_BOOT, NodeRole.WORKER),
    Example("monitoring-agent", "Monitoring agent", "starts Prometheus' node_exporter at boot",
            Event.NODE_BOOT, NodeRole.WORKER),
    Example("slack-job-end", "Slack message at job end", "posts each job's end to the Slack "
            "webhook in the secret SLACK_WEBHOOK_URL", Event.JOB_END, NodeRole.WORKER),
)
BY_KEY = {example.key: example for example in EXAMPLES}


def scripts_from(keys):
    """{(event, role): body} for the chosen examples; two for one event and role run one
    after the other in one script (the library's examples never exit early)."""
    bodies = {}
    for key in keys:
        example = BY_KEY[key]
        bodies.setdefault((example.event, example.role), []).append(example.body())
    return {where: "\n".join(parts) for where, parts in bodies.items()}
