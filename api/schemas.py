"""What the API answers and takes: the OpenAPI schema is generated from these."""

from datetime import datetime
from uuid import UUID

from ninja import Field, Schema

from healthchecks.forms import SilenceForm
from healthchecks.models import CheckRun
from nodes.forms import PauseNodeForm
from repairs.choices import DrainMode
from repairs.forms import AbortRepairForm, CommentForm, GoOnNowForm, ProposeRepairForm
from repairs.models import Repair


DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


def form_limit(form, field):
    """A page form's limit on a field: a body the API takes has the same limits as the form
    that takes it on the page (and OpenAPI shows them), written once, in the form."""
    return form.base_fields[field].max_length


def column_limit(model, field):
    return model._meta.get_field(field).max_length


class Problem(Schema):
    """An error, as RFC 9457 problem details (application/problem+json)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""


class ClusterOut(Schema):
    slug: str
    name: str
    region: str
    gpu_type: str
    gpus_per_node: int
    scheduler: str
    status: str = Field(description="paused, provisioning, accepting, degraded or ready "
                                    "(DESIGN.md \"Cluster status\")")
    status_reason: str
    degraded_threshold_pct: int
    nodes: int
    nodes_by_state: dict[str, int]


class LiveNumbers(Schema):
    util_mean: float | None
    util_max: float | None
    mem_used_bytes: int | None
    mem_total_bytes: int | None
    mem_used_pct: float | None
    temp_max: float | None
    power_w: float | None


class SlurmdReading(Schema):
    state: str | None = None
    pid: int | None = None
    since: float | None = Field(None, description="Unix seconds: when this slurmd started")
    restarts: int | None = Field(None, description="by the agent, since it started")
    last_restart_at: float | None = None
    watched_by: str | None = None
    restart: bool | None = Field(None, description="whether the agent restarts a dead slurmd")


class ProcessReading(Schema):
    zombies: int | None = None
    orphans: int | None = Field(None, description="of ended jobs")
    tasks: int | None = None
    pid_max: int | None = None
    checked_at: float | None = None


class GresReading(Schema):
    match: bool | None = Field(None, description="Slurm's view of the GPUs matches NVML's; "
                                                 "null: not compared (not_compared says why)")
    not_compared: str | None = None
    nvml_gpus: int | None = None
    slurm_gpus: int | None = None
    checked_at: float | None = None


class HygieneReadings(Schema):
    """The node's agent's latest node hygiene readings (sample.hygiene)."""

    slurmd: SlurmdReading | None = None
    processes: ProcessReading | None = None
    gres: GresReading | None = None


class NodeOut(Schema):
    name: str
    hostname: str
    state: str
    role: str
    paused: bool = Field(..., description="its state is paused: by an operator or a "
                                          "maintenance window")
    paused_by_operator: bool = Field(..., description="an operator paused it (until resumed)")
    gpus: int
    boot_id: str
    agent_version: str = Field(..., description="as its last hello said ('' before one); "
                                                "?agent=other lists nodes on another release "
                                                "than this console's")
    last_seen: datetime | None
    worst_signal: str = ""
    live: LiveNumbers | None = None
    hygiene: HygieneReadings | None = Field(None, description="one node only (not in lists)")


class CommandOut(Schema):
    id: int
    node: str
    action: str
    status: str
    message: str
    requested_at: datetime
    finished_at: datetime | None


class BundleOut(Schema):
    """A diagnostic bundle (PROTOCOL.md "Diagnostic bundles"): operators download it from
    `download_url`."""

    id: UUID = Field(..., alias="public_id")
    node: str
    reason: str
    status: str = Field(..., description="requested, stored, failed (not sent) or expired")
    message: str = Field("", description="why it was not sent, or when it was deleted")
    requested_at: datetime
    stored_at: datetime | None
    size_bytes: int | None
    sha256: str
    files: list[dict] = Field(default_factory=list, description="[{name, size}] inside it")
    download_url: str | None = Field(None, description="while stored (operators)")


class EventOut(Schema):
    id: UUID = Field(..., alias="public_id")
    node: str
    gpu: int | None
    signature: str
    severity: str
    source: str
    message: str
    count: int
    first_seen: datetime
    last_seen: datetime
    closed_at: datetime | None
    closed_reason: str
    acknowledged_at: datetime | None
    in_maintenance: bool


class CheckRunOut(Schema):
    id: UUID = Field(..., alias="public_id")
    node: str
    check: str
    purpose: str
    status: str
    message: str
    metrics: dict
    requested_at: datetime
    finished_at: datetime | None


class DrainJobOut(Schema):
    id: str
    user: str
    name: str
    nodes: list[str]
    time_left_s: int | None = Field(None, description="until its time limit; null: none")


class DrainOut(Schema):
    """How the repair treats the jobs on its node (DESIGN.md "Drain modes"), and, while its
    drain step waits for jobs, which and until when."""

    mode: str = Field(..., description="no_drain, now, after_jobs or signal")
    plan: str = Field(..., description="the plan in words")
    deadline_s: int | None = None
    at_deadline: str = Field("", description="after_jobs: go_on or keep_waiting")
    signal: str = Field("", description="signal: the signal sent (USR1)")
    signal_all_steps: bool = False
    waiting_for_jobs: list[DrainJobOut] = Field(default_factory=list)
    deadline: datetime | None = Field(None, description="when the wait ends (or asks again)")
    past_deadline: bool = False
    stopping: str = Field("", description="why the jobs are being stopped, once they are")


class RepairOut(Schema):
    id: UUID = Field(..., alias="public_id")
    number: int
    node: str
    action: str
    status: str
    signature: str
    reason: str
    requested_at: datetime
    reviewed_by: str | None
    reviewed_at: datetime | None
    review_comment: str
    auto_approved: bool
    waiting_reason: str
    started_at: datetime | None
    finished_at: datetime | None
    outcome: str
    follows: int | None = Field(None, description="the number of the repair this one comes "
                                                  "after: a lighter rung, or a rejected one")
    follows_why: str = ""
    approval_view: dict = Field(default_factory=dict,
                                description="what the card showed the approver: jobs at risk, "
                                            "the nodes they span, the blast radius")
    snooze_until: datetime | None = Field(
        None, description="rejected or cancelled: no new recommendation for its events "
                          "before this (null: until they close)")
    drain: DrainOut
    bundle: BundleOut | None = Field(None, description="the diagnostic bundle taken right "
                                                       "before the act")
    url: str


class JobOut(Schema):
    job_id: str
    name: str
    user: str
    account: str
    partition: str
    node_list: str
    gpus: int
    state: str
    exit_code: str
    start: datetime | None
    end: datetime | None
    elapsed_s: int


class AuditOut(Schema):
    at: datetime
    actor: str
    action: str
    object_type: str
    object_id: str
    object: str
    cluster: str | None
    source_ip: str | None
    changes: dict


class Paging(Schema):
    """limit and offset: every list takes them (and its filters)."""

    limit: int = Field(DEFAULT_LIMIT, ge=1, le=MAX_LIMIT,
                       description=f"how many items at most, 1 to {MAX_LIMIT}")
    offset: int = Field(0, ge=0, description="how many items to skip: 0 for the first page, "
                                             "then the previous answer's next_offset")


class JobQuery(Paging):
    user: str | None = Field(None, description="the job's user")
    state: str | None = Field(None, description="Slurm's job state, any case (RUNNING, "
                                                "FAILED, ...)")
    node: str | None = Field(None, description="a node the job ran on")


class AuditQuery(Paging):
    action: str | None = Field(None, description="the action (repair.approve, node.pause, ...)")
    actor: str | None = Field(None, description="who did it: a username")
    cluster: str | None = Field(None, description="the cluster's slug")


class Page(Schema):
    """One page of a list: at most `limit` items from `offset`."""

    count: int = Field(..., description="every item that matches the filters")
    limit: int
    offset: int
    next_offset: int | None = Field(..., description="the offset of the next page; null on "
                                                     "the last")


class ClusterPage(Page):
    items: list[ClusterOut]


class NodePage(Page):
    items: list[NodeOut]


class BundlePage(Page):
    items: list[BundleOut]


class EventPage(Page):
    items: list[EventOut]


class CheckRunPage(Page):
    items: list[CheckRunOut]


class RepairPage(Page):
    items: list[RepairOut]


class JobPage(Page):
    items: list[JobOut]


class AuditPage(Page):
    items: list[AuditOut]


class Comment(Schema):
    comment: str = Field("", max_length=form_limit(CommentForm, "comment"))


class Approval(Comment):
    confirm_unknown_jobs: bool = Field(
        False, description="approve although the scheduler cannot be read (which jobs it "
                           "stops is unknown); refused without it then")
    drain_mode: str | None = Field(
        None, description="how the jobs are treated, when not as proposed: now, after_jobs "
                          "or signal (no_drain for clean-up and reconfigure only)",
        json_schema_extra={"enum": list(DrainMode.values)})


class GoOnNow(Schema):
    comment: str = Field(..., min_length=1, max_length=form_limit(GoOnNowForm, "comment"))


class Verdict(Comment):
    """Reject or cancel: how long no new recommendation comes for the same events."""

    snooze: str = Field("events", description="events (until they close), 1h, 24h or 7d",
                        json_schema_extra={"enum": [v for v, _ in CommentForm.SNOOZE_CHOICES]})


class Abort(Schema):
    comment: str = Field(..., min_length=1, max_length=form_limit(AbortRepairForm, "comment"))
    resume_node: bool = False


class Propose(Schema):
    action: str = Field(..., max_length=column_limit(Repair, "action"))
    reason: str = Field(..., min_length=1, max_length=form_limit(ProposeRepairForm, "reason"))


class Pause(Schema):
    reason: str = Field(..., min_length=1, max_length=form_limit(PauseNodeForm, "reason"))


class RunCheck(Schema):
    check: str = Field(..., max_length=column_limit(CheckRun, "check_name"))


class Silence(Schema):
    hours: float
    reason: str = Field(..., max_length=form_limit(SilenceForm, "reason"))
