"""The garbage collector of a server process: start-up heap frozen, young objects collected
less often (clusterui/asgi.py and the agent gateway's command, gateway/management/commands/
agent_gateway.py, call apply() once the application is loaded).

Why (bench/README.md, "Latency"): under 2,000 agent connections a server process holds about
half a million objects the collector tracks: Django and the code loaded at start-up, every
connection's protocol objects, the minute's rollups. With Python's default thresholds
(700, 10, 10) the publisher's tick decoded 2,000 live entries a second (about 30,000 dicts
and lists, alive for a few dozen milliseconds; nodes/live_fold.py now keeps sums instead,
but the frames make as many); young collections during the tick promoted
them to the oldest generation, where they die, and that churn sets off a full collection
every 4-5 s: each walks every tracked object and stopped the event loop for 250-400 ms,
which is the ingest's p99.

- gc.freeze() moves everything alive once the application is loaded (Django, models, URL
  confs, templates: ~140,000 objects) out of the collector's reach: no collection walks them
  again. What is frozen is never freed by the collector even if it becomes unreachable later,
  so this is done once, after a collection; the cost is bounded by the start-up heap.
- A first threshold of 50,000 (Python's is 700) lets short-lived objects, each
  frame's, die by reference counting before any collection sees them, so they are
  no longer promoted; full collections then come only from growth of what really lives long
  (connections): minutes apart, not seconds. The other two thresholds stay Python's. A young
  collection walks only the young objects: 10-25 ms, every 10 s or less often. Memory:
  cyclic garbage waits longer for a collection (tens of thousands of objects, a few MB).
"""

import gc

from django.conf import settings

# (young, middle, oldest): see the module's docstring. Python's defaults are (700, 10, 10).
THRESHOLDS = (50_000, 10, 10)


def apply():
    """Tune this process's collector as CLUSTERUI_GC_TUNING says; True when it did."""
    if not settings.CLUSTERUI_GC_TUNING:
        return False
    gc.collect()  # what is garbage now is not frozen (frozen objects are never collected)
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
    return True
