"""The agent's heap once start-up is over (otel_ebpf.agent.settle_heap): start-up's garbage is
collected, what it keeps is frozen, and cycles made later are still collected.

Runs in a child process: freezing and thresholds are per interpreter."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import REPO

PROGRAM = """
import gc, weakref
from otel_ebpf.agent import YOUNG_COLLECTION_THRESHOLD, settle_heap

class Node:
    pass

def cycle():
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)

kept = [Node() for _ in range(5000)]
startup_garbage = cycle()
frozen_before = gc.get_freeze_count()
settle_heap()
frozen = gc.get_freeze_count() - frozen_before
threshold = gc.get_threshold()[0]
later_garbage = cycle()
young = [[] for _ in range(3 * YOUNG_COLLECTION_THRESHOLD)]  # no gc.collect(): the collector's own turn
print(startup_garbage() is None, frozen >= len(kept), threshold == YOUNG_COLLECTION_THRESHOLD, later_garbage() is None)
"""


def test_settle_heap_collects_freezes_and_still_collects_later_cycles() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    )
    startup_collected, kept_frozen, threshold_set, later_collected = result.stdout.split()
    assert startup_collected == "True", "start-up's garbage cycle survived settle_heap"
    assert kept_frozen == "True", "what start-up keeps was not frozen"
    assert threshold_set == "True"
    assert later_collected == "True", "a cycle made after settle_heap was never collected"
