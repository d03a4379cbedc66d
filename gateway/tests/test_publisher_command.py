"""`manage.py publisher` (gateway/publisher.py run_publisher_process): production only. Its
leading, folding and giving the lease up run in tests/test_live_integration.py."""

import pytest
from django.core.management import CommandError, call_command


def test_the_publisher_process_refuses_to_start_without_redis(settings):
    settings.REDIS_URL = ""
    with pytest.raises(CommandError, match="set REDIS_URL"):
        call_command("publisher")
