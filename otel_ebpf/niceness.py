"""The agent's scheduling priority: when the CPUs are contended, the applications it observes run first.

The agent's work can wait (the kernel counts every HTTP/1 request anyway, and sheds whole exchanges
while user space is behind); an application's request cannot. A niceness above the applications'
makes the scheduler hand the CPU to them whenever both want it, while the agent still gets every
idle cycle. Linux weighs niceness between the tasks of one cgroup: in a container, the cgroup's CPU
weight (the pod's CPU request) decides first.
"""

from __future__ import annotations

import os


def set_niceness(value: int) -> bool:
    """Give every thread of this process the niceness ``value`` (Linux keeps one per thread; threads
    started later inherit their creator's). False when the kernel refused for some thread: making
    a thread less nice needs CAP_SYS_NICE."""
    done = True
    for task in os.scandir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(task.name), value)
        except ProcessLookupError:  # the thread ended meanwhile
            continue
        except PermissionError:
            done = False
    return done
