"""Running checks from the console: the check-runs page, the node page's Checks section, and
the run endpoint."""

import pytest
from django.urls import reverse

from clusters.models import AuditEntry
from healthchecks.models import CheckRun
from healthchecks.services import do_record_check_result, do_request_check
from nodes.tests.factories import GpuFactory, NodeFactory

pytestmark = pytest.mark.django_db

RUNS = reverse("healthchecks:runs", args=["prod-h200"])
RUN = reverse("healthchecks:run", args=["prod-h200"])


@pytest.fixture
def node(cluster):
    node = NodeFactory(cluster=cluster, name="gpu-017")
    for index in range(8):
        GpuFactory(node=node, index=index)
    return node


def test_an_operator_runs_a_check_from_the_node_page(client_for, operator, node):
    response = client_for(operator).post(RUN, {"node": "gpu-017", "check": "gpu_compute"},
                                         HTTP_HX_REQUEST="true")
    assert response.status_code == 200
    assert response.text.lstrip().startswith('<div id="run-table" hx-get=')  # polls while moving
    assert "Started gpu_compute on gpu-017." in response.text
    run = CheckRun.objects.get()
    assert (run.node, run.check_name, run.purpose) == (node, "gpu_compute", "on_demand")
    assert run.requested_by == operator and run.params == {"min_tflops": 709.2}
    assert AuditEntry.objects.get().action == "checkrun.request"


def test_a_double_click_starts_one_run_and_says_so(client_for, operator, node):
    client = client_for(operator)
    client.post(RUN, {"node": "gpu-017", "check": "nvml_sanity"}, HTTP_HX_REQUEST="true")
    response = client.post(RUN, {"node": "gpu-017", "check": "nvml_sanity"},
                           HTTP_HX_REQUEST="true")
    assert "Already running on gpu-017: nvml_sanity." in response.text
    assert CheckRun.objects.count() == 1


def test_the_acceptance_choice_runs_the_whole_battery(client_for, operator, node):
    response = client_for(operator).post(RUN, {"node": "gpu-017", "check": "acceptance"})
    assert response.status_code == 302 and response.url == f"{RUNS}?node=gpu-017"
    assert set(CheckRun.objects.values_list("purpose", flat=True)) == {"acceptance"}
    assert CheckRun.objects.count() == 4


def test_bad_input_is_refused_with_a_message_and_starts_nothing(client_for, operator, node):
    client = client_for(operator)
    response = client.post(RUN, {"node": "gpu-999", "check": "gpu_compute"}, follow=True)
    assert "No node gpu-999 in prod-h200." in response.text
    response = client.post(RUN, {"node": "gpu-017", "check": "rm -rf"}, follow=True)
    assert "Select a valid choice" in response.text
    assert not CheckRun.objects.exists()


def test_viewers_see_runs_but_get_no_form_and_403_from_the_endpoint(client_for, viewer, node):
    run, _ = do_request_check(node, "gpu_compute")
    do_record_check_result(node, run_id=run.pk, status="passed",
                           metrics={"tflops": 788.1, "gpus": {"GPU-1": {"tflops": 788.1}}})
    client = client_for(viewer)
    page = client.get(RUNS).text
    assert "tflops <strong>788.1</strong>" in page and "min_tflops 709.2" in page
    assert 'action="/c/prod-h200/health/checks/run/"' not in page
    assert client.post(RUN, {"node": "gpu-017", "check": "gpu_compute"}).status_code == 403
    assert client.get(RUN).status_code == 405


def test_the_table_refetches_itself_when_the_socket_says_a_run_changed(client_for, viewer,
                                                                      node):
    run, _ = do_request_check(node, "storage")
    client = client_for(viewer)
    moving = client.get(RUNS, {"node": "gpu-017"}, HTTP_HX_REQUEST="true").text
    assert moving.lstrip().startswith('<div id="run-table"')
    assert 'hx-trigger="check-changed from:body throttle:1s"' in moving
    assert 'hx-get="/c/prod-h200/health/checks/?node=gpu-017"' in moving
    assert "every" not in moving.split(">", 1)[0]  # no polling
    do_record_check_result(node, run_id=run.pk, status="error",
                           message="/scratch is not writable")
    done = client.get(RUNS, {"node": "gpu-017"}, HTTP_HX_REQUEST="true").text
    assert "/scratch is not writable" in done


def test_the_runs_page_filters_and_its_queries_do_not_grow(client_for, viewer, cluster,
                                                          django_assert_max_num_queries):
    for i in range(30):
        other = NodeFactory(cluster=cluster, name=f"gpu-{i:03d}")
        do_request_check(other, "nvml_sanity")
    client = client_for(viewer)
    with django_assert_max_num_queries(12):
        response = client.get(RUNS, {"status": "queued"})
    assert response.text.count('<tr id="run-') == 30
    assert client.get(RUNS, {"status": "passed"}).text.count('<tr id="run-') == 0


def test_the_node_page_shows_its_checks_and_the_form_to_operators(client_for, operator, node):
    do_request_check(node, "gpu_memory_bandwidth")
    page = client_for(operator).get(reverse("nodes:detail", args=["prod-h200", "gpu-017"])).text
    assert 'id="checks-h"' in page and "gpu_memory_bandwidth" in page
    assert '<input type="hidden" name="node" value="gpu-017">' in page
