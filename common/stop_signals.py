"""A server process's stop: SIGTERM or SIGINT sets an asyncio.Event its main coroutine awaits."""

import asyncio
import signal


def stop_on_signals(stop=None):
    """`stop` (a new asyncio.Event if None), set by SIGTERM or SIGINT on the running loop.
    Tests pass their own event and run off the main thread, where no handler can be added."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
        except (RuntimeError, ValueError):  # not the main thread (tests)
            pass
    return stop
