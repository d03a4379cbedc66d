"""Startup scripts: validation, versions, diff, roll back, delivery to agents, and their runs.

- validate_body() runs `bash -n` (syntax) and shellcheck (the rest) on a temp file, each
  with a time limit. A syntax error refuses a save; shellcheck's warnings must be accepted.
- do_save_startup_script() / do_roll_back_startup_script(): every save is a new version
  (a roll back is a new version with an old body), audited, and sent to the cluster's
  connected agents once committed (AgentConsumer.config_changed).
- config_frame_for(): the `config` frame for a node (shared/PROTOCOL.md).
- do_record_script_run(): a script_result frame becomes a ScriptRun; a failure opens
  `startup_script_failed`, a later success of the same script closes it.
"""

import difflib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.db import transaction
from django.db.models import Max
from django.http import HttpRequest
from django.utils import timezone

from clusters.change_feed import Kind, record_change, record_node_changes
from clusters.models import Cluster
from clusters.secret_store import SecretsUnavailable, referenced_names, values_referenced_in
from clusters.services import record_audit
from healthchecks.services import do_close_health_event, do_record_health_event
from nodes.models import Node
from nodes.states import refresh_node_state

from .models import ScriptEvent, ScriptRun, StartupScript, StartupScriptVersion

logger = logging.getLogger(__name__)

BASH_N_TIMEOUT_S = 10
SHELLCHECK_TIMEOUT_S = 20
OUTPUT_TAIL_CHARS = 4096
FAILED_SIGNATURE = "startup_script_failed"


@dataclass(frozen=True)
class Validation:
    syntax_error: str = ""  # bash -n's message, "" when the syntax is good
    syntax_line: int | None = None
    warnings: str = ""  # shellcheck's findings, "" when it found none
    shellcheck_missing: bool = False

    @property
    def shellcheck_note(self):
        return "shellcheck is not installed on the server: the script was not linted" \
            if self.shellcheck_missing else ""


def _run_on_file(argv, path, timeout_s):
    """(exit code, output) of argv + [path]; a time limit ends it as a failure."""
    try:
        done = subprocess.run([*argv, path], capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"{argv[0]} took longer than {timeout_s} s"
    return done.returncode, (done.stdout + done.stderr).strip()


def validate_body(body):
    """Check a script body with `bash -n` and shellcheck, on a temp file."""
    with tempfile.TemporaryDirectory(prefix="clusterui-script-") as folder:
        path = os.path.join(folder, "script.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(body)
        code, output = _run_on_file(["bash", "-n"], path, BASH_N_TIMEOUT_S)
        if code != 0:
            output = output.replace(path, "script")
            match = re.search(r"line (\d+):", output)
            return Validation(syntax_error=output or "bash -n refused the script",
                              syntax_line=int(match.group(1)) if match else None)
        shellcheck = shutil.which("shellcheck")
        if shellcheck is None:
            return Validation(shellcheck_missing=True)
        # -s bash: a body without a #! line is run by bash (the agent runs it so).
        code, output = _run_on_file([shellcheck, "-s", "bash", "-f", "gcc"], path,
                                    SHELLCHECK_TIMEOUT_S)
        output = output.replace(path, "script")
        return Validation(warnings=output if code != 0 else "")


def normalize_body(body):
    """Browsers send CRLF; bash reads a CR as part of the word."""
    return body.replace("\r\n", "\n")


def current_scripts(cluster):
    """{(event, role): script} for the cluster, current versions loaded."""
    scripts = cluster.startup_scripts.select_related("current_version")
    return {(s.event, s.role): s for s in scripts}


def _new_version(script, body, *, actor, now, validation=None, accepted=False,
                 rolled_back_from=None):
    number = (script.versions.aggregate(n=Max("number"))["n"] or 0) + 1
    warnings = ""
    if validation is not None:
        warnings = validation.warnings or validation.shellcheck_note
    version = StartupScriptVersion.objects.create(
        script=script, number=number, body=body, created_by=actor, created_at=now,
        shellcheck_warnings=warnings, warnings_accepted=accepted and bool(warnings),
        rolled_back_from=rolled_back_from)
    StartupScript.objects.filter(pk=script.pk).update(current_version=version)
    script.current_version = version
    return version


@transaction.atomic
def do_save_startup_script(cluster: Cluster, *, event, role, body, timeout_s, validation,
                           accepted_warnings=False, actor: AbstractBaseUser | None = None,
                           request: HttpRequest | None = None,
                           now: datetime | None = None) -> StartupScriptVersion:
    """Save a validated body as the script's next version (the script is made on its first
    save). The caller validated it (validate_body) and refused syntax errors and unaccepted
    warnings. Returns the new version."""
    now = now or timezone.now()
    script, created = StartupScript.objects.select_for_update().get_or_create(
        cluster=cluster, event=event, role=role, defaults={"timeout_s": timeout_s})
    before_timeout = script.timeout_s
    if script.timeout_s != timeout_s:
        StartupScript.objects.filter(pk=script.pk).update(timeout_s=timeout_s)
        script.timeout_s = timeout_s
    version = _new_version(script, normalize_body(body), actor=actor, now=now,
                           validation=validation, accepted=accepted_warnings)
    changes = {"version": version.number, "event": event, "role": role}
    if not created and before_timeout != timeout_s:
        changes["timeout_s"] = {"before": before_timeout, "after": timeout_s}
    if version.shellcheck_warnings:
        changes["shellcheck_warnings_accepted"] = version.warnings_accepted
    record_audit(actor, "startupscript.save", script, changes=changes, cluster=cluster,
                 request=request, now=now)
    announce_scripts_changed(cluster)
    return version


@transaction.atomic
def do_roll_back_startup_script(script, number, *, actor: AbstractBaseUser | None = None,
                                request: HttpRequest | None = None,
                                now: datetime | None = None) -> StartupScriptVersion:
    """A new version with version `number`'s body. Returns it."""
    now = now or timezone.now()
    script = StartupScript.objects.select_for_update().get(pk=script.pk)
    old = script.versions.get(number=number)
    version = _new_version(script, old.body, actor=actor, now=now, rolled_back_from=number)
    version.shellcheck_warnings = old.shellcheck_warnings
    version.warnings_accepted = old.warnings_accepted
    version.save(update_fields=["shellcheck_warnings", "warnings_accepted"])
    record_audit(actor, "startupscript.rollback", script, cluster=script.cluster,
                 changes={"version": version.number, "body_of_version": number},
                 request=request, now=now)
    announce_scripts_changed(script.cluster)
    return version


def diff_lines(old, new):
    """A unified diff of two versions, as (css class, line) pairs for the page."""
    lines = difflib.unified_diff(
        old.body.splitlines(), new.body.splitlines(),
        fromfile=f"version {old.number}", tofile=f"version {new.number}", lineterm="")
    out = []
    for line in lines:
        if line.startswith(("+++", "---")):
            kind = "head"
        elif line.startswith("@@"):
            kind = "hunk"
        elif line.startswith("+"):
            kind = "add"
        elif line.startswith("-"):
            kind = "del"
        else:
            kind = "same"
        out.append((kind, line))
    return out


# Delivery


def scripts_for(cluster_id, role):
    """The `startup_scripts` of a config frame: the cluster's current scripts for the role,
    each with `env`: the secrets its body names as $NAME (clusters/secret_store.py), which
    the agent hands the script as environment variables and masks in its output. One read,
    and one more only where a script names a secret: this runs at every hello."""
    scripts = list(StartupScript.objects.filter(
        cluster_id=cluster_id, role=role, current_version__isnull=False
    ).select_related("current_version").order_by("event", "id"))
    try:
        secrets = values_referenced_in(*(s.current_version.body for s in scripts))
    except SecretsUnavailable as exc:  # the scripts run, without them; the log says why
        logger.error("startup scripts go to %s nodes of cluster %s without their secrets: %s",
                     role, cluster_id, exc)
        secrets = {}
    entries = []
    for s in scripts:
        entry = {"id": s.pk, "version": s.current_version.number, "event": s.event,
                 "role": s.role, "timeout_s": s.timeout_s, "body": s.current_version.body}
        env = {name: secrets[name] for name in referenced_names(s.current_version.body)
               if name in secrets}
        if env:
            entry["env"] = env
        entries.append(entry)
    return entries


def config_frame_from(cluster_id, role, sample_interval_s):
    """The `config` frame for a node of this cluster and role."""
    return {"type": "config", "sample_interval_s": sample_interval_s,
            "startup_scripts": scripts_for(cluster_id, role)}


def config_frame_for(node_id, sample_interval_s):
    node = Node.objects.only("cluster_id", "role").get(pk=node_id)
    return config_frame_from(node.cluster_id, node.role, sample_interval_s)


def announce_scripts_changed(cluster):
    """Every connected agent of the cluster gets its new config (once committed)."""
    announce_config_changed(cluster.pk, cluster.nodes.values_list("pk", flat=True))


def announce_config_changed(cluster_id, node_ids):
    """Change rows in the caller's transaction: once committed, the publisher tells the
    connected agents of these nodes, and AgentConsumer.config_changed sends their config
    then, from the committed scripts and role. An agent not connected gets it at its next
    hello."""
    record_node_changes(Kind.AGENT_CONFIG, cluster_id=cluster_id, node_ids=list(node_ids))


# Runs


def has_boot_scripts(node):
    return StartupScript.objects.filter(
        cluster_id=node.cluster_id, role=node.role, event=ScriptEvent.NODE_BOOT,
        current_version__isnull=False).exists()


@transaction.atomic
def do_record_script_run(node: Node, frame, now: datetime | None = None) -> ScriptRun:
    """Store a script_result frame. Returns the ScriptRun."""
    now = now or timezone.now()
    script = StartupScript.objects.filter(pk=frame["script_id"],
                                          cluster_id=node.cluster_id).first()
    number = frame.get("version")
    version = None
    if script is not None and isinstance(number, int):
        version = script.versions.filter(number=number).first()
    exit_code = frame["exit_code"]
    timed_out = bool(frame.get("timed_out")) or exit_code is None
    job_id = frame.get("job_id")
    run = ScriptRun.objects.create(
        node=node, script=script, version=version,
        version_number=number if isinstance(number, int) else None,
        event=frame["event"], job_id=str(job_id) if job_id is not None else "",
        exit_code=exit_code, timed_out=timed_out, duration_s=frame["duration_s"],
        output_tail=(frame.get("output_tail") or "")[-OUTPUT_TAIL_CHARS:], received_at=now)
    name = str(script) if script is not None else f"script {frame['script_id']}"
    if run.succeeded:
        open_event = node.health_events.open().filter(
            gpu=None, signature=FAILED_SIGNATURE, evidence__script_id=frame["script_id"]).first()
        if open_event is not None:
            do_close_health_event(open_event, reason=f"{name} succeeded", now=now)
    else:
        how = "timed out" if timed_out else f"exited with {exit_code}"
        job = f" (job {run.job_id})" if run.job_id else ""
        do_record_health_event(
            node, signature=FAILED_SIGNATURE, severity="warning",
            message=f"{name}, version {number}{job}: {how}",
            evidence={"script_id": frame["script_id"], "version": number,
                      "event": frame["event"], "job_id": run.job_id, "exit_code": exit_code,
                      "timed_out": timed_out, "output_tail": run.output_tail[-1000:]},
            now=now)
    if run.event == ScriptEvent.NODE_BOOT:
        release_boot_hold_if_done(node, now=now)
    record_change(Kind.SCRIPT_RUN, cluster_id=node.cluster_id, node_id=node.pk,
                  object_id=run.pk, now=now)
    return run


# Boot scripts hold a node in booting (the node's boot_tasks_running, read by nodes.states)

BOOT_GRACE_S = 120  # beyond the scripts' own limits: the agent's start, the result's trip


def boot_scripts(node):
    return StartupScript.objects.filter(
        cluster_id=node.cluster_id, role=node.role, event=ScriptEvent.NODE_BOOT,
        current_version__isnull=False)


def do_hold_for_boot_scripts(node: Node, *, rebooted, now: datetime | None = None) -> bool:
    """At a hello with a new boot id: the agent runs the node's boot scripts once per boot,
    and the node stays booting until their results arrive (or boot_deadline passes)."""
    if not rebooted or not boot_scripts(node).exists():
        return False
    node.refresh_from_db(fields=["booted_at"])
    Node.objects.filter(pk=node.pk).update(boot_tasks_running=True,
                                           boot_scripts_due_by=boot_deadline(node))
    refresh_node_state(node, reason="boot scripts running", now=now)
    return True


def boot_deadline(node):
    """When a node stops waiting for its boot scripts' results."""
    limits = sum(boot_scripts(node).values_list("timeout_s", flat=True))
    return node.booted_at + timedelta(seconds=limits + BOOT_GRACE_S)


def _release_boot_hold(node, reason, now):
    held = Node.objects.filter(pk=node.pk, boot_tasks_running=True,
                               boot_scripts_due_by__isnull=False)
    if held.update(boot_tasks_running=False, boot_scripts_due_by=None):
        refresh_node_state(node, reason=reason, now=now)
        return True
    return False


def release_boot_hold_if_done(node, now=None):
    """After a node_boot result: every boot script has a result since the boot."""
    node.refresh_from_db(fields=["boot_tasks_running", "boot_scripts_due_by", "booted_at"])
    if not node.boot_tasks_running or node.boot_scripts_due_by is None:
        return False
    since = node.booted_at or timezone.now()
    ran = set(ScriptRun.objects.filter(node=node, event=ScriptEvent.NODE_BOOT,
                                       received_at__gte=since).values_list("script_id", flat=True))
    if set(boot_scripts(node).values_list("pk", flat=True)) - ran:
        return False
    return _release_boot_hold(node, "boot scripts done", now or timezone.now())


def do_end_overdue_boot_holds(now: datetime | None = None) -> int:
    """Nodes whose boot scripts' results never came within the deadline stop booting (a beat
    task, startup.tasks.end_overdue_boot_holds). Returns how many."""
    now = now or timezone.now()
    released = 0
    for node in Node.objects.filter(boot_tasks_running=True, boot_scripts_due_by__lte=now):
        released += _release_boot_hold(node, "boot scripts' results overdue", now)
    return released


def prune_script_runs(now=None):
    """Script runs received more than CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS ago go. Returns
    how many."""
    now = now or timezone.now()
    cutoff = now - timedelta(days=settings.CLUSTERUI_SCRIPT_RUN_RETENTION_DAYS)
    deleted, _ = ScriptRun.objects.filter(received_at__lt=cutoff).delete()
    return deleted
