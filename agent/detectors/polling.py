"""The base of the watchers whose reading may block (a subprocess, an NVML call that is
not part of the sample): their check runs in a thread of its own, on its own cadence,
and the events it finds wait in a queue until the client's next poll() takes them."""

import logging
import queue
import threading

log = logging.getLogger(__name__)


class PollingWatcher:
    """A subclass defines check_once() -> [event frames], called every `interval_s`
    seconds in a daemon thread once start() is called. It sets `self.finished` when
    there is nothing left to check (every GPU gone or unsupported), which ends the
    thread."""

    thread_name = "watcher"

    def __init__(self, interval_s):
        self.interval_s = interval_s
        self.finished = False
        self._events = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._thread = None

    def check_once(self):
        raise NotImplementedError

    def start(self):
        self._thread = threading.Thread(target=self._run, name=self.thread_name, daemon=True)
        self._thread.start()

    def poll(self, readings):
        """The events found since the last call; never waits."""
        events = []
        while True:
            try:
                events.append(self._events.get_nowait())
            except queue.Empty:
                return events

    def close(self):
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self):
        while not self._stopping.is_set() and not self.finished:
            try:
                for event in self.check_once():
                    self._events.put(event)
            except Exception:  # a bug in one check must not end the agent's other checks
                log.exception("%s failed; trying again in %g s", self.thread_name, self.interval_s)
            self._stopping.wait(self.interval_s)
