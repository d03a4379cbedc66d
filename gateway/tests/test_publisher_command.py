"""`manage.py publisher` (gateway/publisher.py run_publisher_process): production only. Its
leading, folding and giving the lease up run in tests/test_live_integration.py."""

import pytest
from django.core.management import CommandError, call_command


def test_the_publisher_process_refuses_to_start_without_redis(settings):
    settings.REDIS_URL = ""
    with pytest.raises(CommandError, match="set REDIS_URL"):
        call_command("publisher")


def test_the_publisher_process_refuses_to_start_where_it_may_not_lead(settings):
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.CLUSTERUI_PUBLISHER_LEADS = False
    with pytest.raises(CommandError, match="would never lead"):
        call_command("publisher")
