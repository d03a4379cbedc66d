"""Startup scripts: validation on save, versions, diff, roll back, the admin pages, and the
runs the agents report (issue 7)."""

import shutil
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.urls import reverse
from django.utils import timezone

from clusters.models import AuditEntry
from clusters.secret_store import do_set_secret
from healthchecks.models import HealthEvent
from nodes.choices import NodeState
from nodes.models import Node
from startup.models import ScriptRun, StartupScript
from startup.services import (
    Validation,
    config_frame_for,
    diff_lines,
    do_end_overdue_boot_holds,
    do_hold_for_boot_scripts,
    do_record_script_run,
    do_roll_back_startup_script,
    do_save_startup_script,
    validate_body,
)
from nodes.states import refresh_node_state
from nodes.tests.factories import NodeFactory

GOOD = "#!/bin/bash\nset -euo pipefail\necho ready\n"
SYNTAX_ERROR = "#!/bin/bash\necho one\nif true; then\n  echo two\n"  # no fi
WARNING = "#!/bin/bash\nrm -rf $DIR/cache\n"  # SC2086: double quote to prevent globbing

needs_shellcheck = pytest.mark.skipif(shutil.which("shellcheck") is None,
                                      reason="shellcheck is installed by scripts/test.sh")


def save(cluster, body=GOOD, event="node_boot", role="worker", timeout_s=60, **kwargs):
    return do_save_startup_script(cluster, event=event, role=role, body=body,
                                  timeout_s=timeout_s, validation=validate_body(body), **kwargs)


# Validation


def test_a_good_script_passes_both_checks():
    validation = validate_body(GOOD)
    assert validation == Validation(shellcheck_missing=shutil.which("shellcheck") is None)


def test_a_syntax_error_is_found_with_its_line():
    validation = validate_body(SYNTAX_ERROR)
    assert validation.syntax_line == 5
    assert "syntax error" in validation.syntax_error
    assert "/tmp" not in validation.syntax_error  # the temp file is called "script"


@needs_shellcheck
def test_shellcheck_warnings_are_reported():
    validation = validate_body(WARNING)
    assert not validation.syntax_error
    assert "SC2086" in validation.warnings and "script:2:" in validation.warnings


def test_without_shellcheck_it_says_so(monkeypatch):
    monkeypatch.setattr("startup.services.shutil.which", lambda name: None)
    validation = validate_body(WARNING)
    assert validation.shellcheck_missing and validation.warnings == ""
    assert "not installed" in validation.shellcheck_note


# Versions, diff, roll back


@pytest.mark.django_db
def test_every_save_is_a_new_version_and_audited(cluster, admin):
    first = save(cluster, actor=admin)
    second = save(cluster, body=GOOD + "echo more\n", timeout_s=90, actor=admin)
    script = StartupScript.objects.get()
    assert (first.number, second.number) == (1, 2)
    assert script.current_version == second and script.timeout_s == 90
    entries = list(AuditEntry.objects.filter(action="startupscript.save").order_by("at", "id"))
    assert [e.changes["version"] for e in entries] == [1, 2]
    assert entries[1].changes["timeout_s"] == {"before": 60, "after": 90}
    assert entries[1].actor == admin


@pytest.mark.django_db
def test_the_diff_shows_what_changed(cluster):
    first = save(cluster)
    second = save(cluster, body=GOOD.replace("ready", "up"))
    lines = diff_lines(first, second)
    assert ("del", "-echo ready") in lines and ("add", "+echo up") in lines
    assert lines[0] == ("head", "--- version 1")


@pytest.mark.django_db
def test_roll_back_is_a_new_version_with_the_old_body(cluster, admin):
    save(cluster)
    save(cluster, body=GOOD.replace("ready", "up"))
    script = StartupScript.objects.get()
    version = do_roll_back_startup_script(script, 1, actor=admin)
    script.refresh_from_db()
    assert version.number == 3 and version.rolled_back_from == 1
    assert script.current_version.body == GOOD
    entry = AuditEntry.objects.get(action="startupscript.rollback")
    assert entry.changes == {"version": 3, "body_of_version": 1}


# Pages


def edit_url(cluster, event="node_boot", role="worker"):
    return reverse("startup:edit", args=[cluster.slug, event, role])


@pytest.mark.django_db
def test_an_admin_saves_a_good_script(client, cluster, admin):
    client.force_login(admin)
    response = client.post(edit_url(cluster), {"body": GOOD.replace("\n", "\r\n"),
                                               "timeout_s": 120})
    assert response.status_code == 302
    script = StartupScript.objects.get(cluster=cluster, event="node_boot", role="worker")
    assert script.current_version.body == GOOD and script.timeout_s == 120


@pytest.mark.django_db
def test_the_header_names_the_users_role_not_the_scripts_node_role(client, cluster, admin):
    """The page's own `role` (the node role a script is for) once replaced the user's role
    in the layout's header: "admin (worker)"."""
    client.force_login(admin)
    response = client.get(edit_url(cluster))
    assert response.status_code == 200
    text = response.content.decode()
    assert f'{admin.username} <span class="role">(admin)</span>' in text
    assert "(worker)" not in text


@pytest.mark.django_db
def test_a_syntax_error_refuses_the_save_and_shows_the_line(client, cluster, admin):
    client.force_login(admin)
    response = client.post(edit_url(cluster), {"body": SYNTAX_ERROR, "timeout_s": 60,
                                               "accept_warnings": "on"})
    assert response.status_code == 400
    assert "syntax error at line 5" in response.content.decode()
    assert not StartupScript.objects.exists()


@needs_shellcheck
@pytest.mark.django_db
def test_warnings_refuse_the_save_until_accepted(client, cluster, admin):
    client.force_login(admin)
    response = client.post(edit_url(cluster), {"body": WARNING, "timeout_s": 60})
    assert response.status_code == 400
    page = response.content.decode()
    assert "SC2086" in page and "accept them to save" in page
    assert not StartupScript.objects.exists()

    response = client.post(edit_url(cluster), {"body": WARNING, "timeout_s": 60,
                                               "accept_warnings": "on"})
    assert response.status_code == 302
    version = StartupScript.objects.get().current_version
    assert version.warnings_accepted and "SC2086" in version.shellcheck_warnings


@pytest.mark.django_db
def test_without_shellcheck_the_form_says_so(client, cluster, admin, monkeypatch):
    monkeypatch.setattr("startup.services.shutil.which", lambda name: None)
    client.force_login(admin)
    response = client.post(edit_url(cluster), {"body": WARNING, "timeout_s": 60}, follow=True)
    assert "shellcheck is not installed on the server" in response.content.decode()
    version = StartupScript.objects.get().current_version
    assert "not installed" in version.shellcheck_warnings and not version.warnings_accepted


@pytest.mark.django_db
def test_a_viewer_sees_the_script_exists_but_neither_reads_nor_saves_it(client, cluster,
                                                                         viewer):
    save(cluster)
    client.force_login(viewer)
    page = client.get(edit_url(cluster)).content.decode()
    assert "echo ready" not in page and "Only admins read and change startup scripts" in page
    assert "name=\"body\"" not in page
    assert client.post(edit_url(cluster), {"body": GOOD, "timeout_s": 5}).status_code == 403


@pytest.mark.django_db
def test_the_versions_page_shows_the_diff_and_rolls_back(client, cluster, admin):
    save(cluster)
    save(cluster, body=GOOD.replace("ready", "up"))
    client.force_login(admin)
    url = reverse("startup:versions", args=[cluster.slug, "node_boot", "worker"])
    page = client.get(url).content.decode()
    assert "-echo ready" in page and "+echo up" in page
    response = client.post(reverse("startup:roll_back",
                                   args=[cluster.slug, "node_boot", "worker", 1]))
    assert response.status_code == 302
    assert StartupScript.objects.get().current_version.body == GOOD
    assert client.get(reverse("startup:roll_back",
                              args=[cluster.slug, "node_boot", "worker", 1])).status_code == 405


@pytest.mark.django_db
def test_an_unknown_event_or_role_is_404(client, cluster, viewer):
    client.force_login(viewer)
    assert client.get(edit_url(cluster, event="reboot")).status_code == 404
    assert client.get(edit_url(cluster, role="gpu")).status_code == 404


# Delivery and runs


@pytest.mark.django_db
def test_the_config_frame_carries_the_current_scripts_of_the_nodes_role(cluster):
    node = NodeFactory(cluster=cluster)
    save(cluster)
    version = save(cluster, body=GOOD.replace("ready", "up"))
    save(cluster, event="job_start", role="login")
    frame = config_frame_for(node.pk, 1.0)
    assert frame == {"type": "config", "sample_interval_s": 1.0, "startup_scripts": [
        {"id": version.script_id, "version": 2, "event": "node_boot", "role": "worker",
         "timeout_s": 60, "body": version.body}]}


def result(script, version=1, exit_code=0, **extra):
    return {"type": "script_result", "script_id": script.pk, "version": version,
            "event": script.event, "exit_code": exit_code, "duration_s": 0.5,
            "output_tail": "done\n", **extra}


@pytest.mark.django_db
def test_a_failure_opens_startup_script_failed_and_a_later_success_closes_it(cluster, client,
                                                                             viewer):
    node = NodeFactory(cluster=cluster)
    script = save(cluster, event="job_start").script
    do_record_script_run(node, result(script, exit_code=3, job_id="48213"))
    event = HealthEvent.objects.open().get(node=node, signature="startup_script_failed")
    assert event.severity == "warning" and "exited with 3" in event.message

    do_record_script_run(node, result(script, exit_code=0, job_id="48214"))
    event.refresh_from_db()
    assert event.closed_at is not None
    runs = list(ScriptRun.objects.filter(node=node).order_by("received_at", "id"))
    assert [(r.job_id, r.exit_code) for r in runs] == [("48213", 3), ("48214", 0)]

    client.force_login(viewer)
    page = client.get(node.get_absolute_url()).content.decode()
    assert "Startup script runs" in page and "48213" in page and "exit 3" in page


@pytest.mark.django_db
def test_a_timed_out_run_is_a_failure(cluster):
    node = NodeFactory(cluster=cluster)
    script = save(cluster).script
    run = do_record_script_run(node, result(script, exit_code=None, timed_out=True))
    assert run.timed_out and not run.succeeded
    assert "timed out" in HealthEvent.objects.open().get(node=node).message


@pytest.mark.django_db
def test_boot_scripts_hold_the_node_booting_until_their_results(cluster, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    now = timezone.now()
    node = NodeFactory(cluster=cluster, booted_at=now, last_hello_at=now)
    first = save(cluster).script
    second = save(cluster, body=GOOD, role="worker", event="node_boot").script
    assert first == second
    assert do_hold_for_boot_scripts(node, rebooted=True, now=now)
    node.refresh_from_db()
    assert node.state == NodeState.BOOTING and node.boot_tasks_running

    do_record_script_run(node, result(first, version=2))
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY and not node.boot_tasks_running


@pytest.mark.django_db
def test_no_hold_without_boot_scripts_or_without_a_reboot(cluster):
    node = NodeFactory(cluster=cluster, booted_at=timezone.now())
    assert not do_hold_for_boot_scripts(node, rebooted=True)
    save(cluster)
    assert not do_hold_for_boot_scripts(node, rebooted=False)


@pytest.mark.django_db
def test_a_boot_hold_ends_when_the_results_are_overdue(cluster, settings):
    settings.CLUSTERUI_BOOT_WINDOW_S = 0
    now = timezone.now()
    node = NodeFactory(cluster=cluster, booted_at=now, last_hello_at=now)
    save(cluster, timeout_s=60)
    do_hold_for_boot_scripts(node, rebooted=True, now=now)
    assert do_end_overdue_boot_holds(now=now + timedelta(seconds=179)) == 0
    assert do_end_overdue_boot_holds(now=now + timedelta(seconds=181)) == 1
    node.refresh_from_db()
    assert node.state == NodeState.HEALTHY and node.boot_scripts_due_by is None
    assert node.transitions.first().reason == "boot scripts' results overdue"
    refresh_node_state(node)
    assert Node.objects.get(pk=node.pk).state == NodeState.HEALTHY


@pytest.mark.django_db
def test_a_script_gets_the_secrets_it_names_and_no_others(cluster, admin, settings):
    settings.CLUSTERUI_SECRETS_KEYS = [Fernet.generate_key().decode()]
    do_set_secret("REGISTRY_TOKEN", "tok-123", actor=admin)
    do_set_secret("UNUSED", "never-sent", actor=admin)
    node = NodeFactory(cluster=cluster)
    version = save(cluster, body=GOOD.replace("echo ready", 'docker login -p "$REGISTRY_TOKEN"'))
    [entry] = config_frame_for(node.pk, 1.0)["startup_scripts"]
    assert entry["env"] == {"REGISTRY_TOKEN": "tok-123"} and entry["version"] == version.number


@pytest.mark.django_db
def test_viewers_see_that_a_script_exists_not_its_text(cluster, client_for, viewer):
    save(cluster, body=GOOD.replace("echo ready", "echo the-body-text"))
    client = client_for(viewer)
    for name in ("startup:edit", "startup:versions"):
        page = client.get(reverse(name, args=[cluster.slug, "node_boot", "worker"]),
                          {"show": 1}).content.decode()
        assert "the-body-text" not in page
    page = client.get(reverse("startup:edit", args=[cluster.slug, "node_boot", "worker"]))
    assert "Version 1 runs at this event" in page.content.decode()
