"""What the agent needs that the Python of its nodes may not have. The agent runs on the
Python of the OSes its users run: Ubuntu 22.04 ships 3.10 and RHEL 9 ships 3.9, so it
supports 3.9 and later (tests/test_agent_python_versions.py checks it with vermin).

- `tomllib` (3.11): tomli, the package it came from, on older Pythons.
- `timeout` (asyncio.timeout, 3.11): async-timeout's, on older Pythons; both have
  reschedule(). On 3.9 and 3.10 it raises asyncio.TimeoutError, which is not the builtin
  TimeoutError there: catch asyncio.TimeoutError (the same class from 3.11 on).
"""

import sys

if sys.version_info >= (3, 11):
    import tomllib
    from asyncio import timeout  # novermin: 3.9 and 3.10 take the else branch
else:  # pragma: no cover - the suite runs on the server's 3.11
    import tomli as tomllib
    from async_timeout import timeout

__all__ = ["timeout", "tomllib"]
