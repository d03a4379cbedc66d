"""The cluster's own field validators."""

import pytest
from django.core.exceptions import ValidationError

from clusters.models import validate_grafana_url_template


@pytest.mark.parametrize("template, problem", [
    ("https://grafana.example.com/d/dcgm?var-instance={node}&var-cluster={cluster}", None),
    ("https://grafana.example.com/d/x?host={hostname}", "Unknown placeholder {hostname}"),
    ("grafana.example.com/{node}", "Enter a valid URL"),
])
def test_the_grafana_template_takes_node_and_cluster_only(template, problem):
    if problem is None:
        validate_grafana_url_template(template)
        return
    with pytest.raises(ValidationError, match=problem):
        validate_grafana_url_template(template)
