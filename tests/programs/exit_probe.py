"""Test instrument: at exit, write whether torch.distributed is still initialised and which
communication threads are still running.

Registered before the program's ``init_process_group``, its handler runs after every exit
handler registered later (atexit is last in, first out), just before the interpreter
finalises. It lives in its own module so that it holds nothing of the program's.
"""

import atexit
import json
import os

COMMUNICATION_THREADS = ("gloo", "nccl", "c10d")


def threads():
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{task}/comm") as comm:
                names.append(comm.read().strip())
        except FileNotFoundError:                     # the thread ended while we looked
            continue
    return sorted(name for name in names if any(word in name for word in COMMUNICATION_THREADS))


def report_at_exit(path: str) -> None:
    def write():
        import torch.distributed
        with open(path, "w") as out:
            json.dump({"initialized": torch.distributed.is_initialized(), "threads": threads()}, out)
    atexit.register(write)
