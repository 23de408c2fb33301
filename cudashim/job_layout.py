"""Where this process sits in a job, whichever launcher started it: its rank, and how many
ranks share its node.

On a GPU machine each of a node's ranks calls ``torch.cuda.set_device(local_rank)`` on a device
of its own. Where the target has fewer devices (one host, one real accelerator), the backends
give each local rank a CUDA index of its own; they learn how many from the launcher's
environment, read here. The report names each rank's file by its rank.
"""

import os
import re
from typing import Optional

_REPEATED = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


def slurm_tasks_on_node(tasks_per_node: str, node_id: int) -> Optional[int]:
    """The task count of node ``node_id`` in Slurm's compressed SLURM_TASKS_PER_NODE
    ("2(x3),1": three nodes of two tasks, then one of one); None where it is malformed or
    has no such node."""
    counts = []
    for part in tasks_per_node.split(","):
        match = _REPEATED.match(part.strip())
        if match is None:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[node_id] if 0 <= node_id < len(counts) else None


def _positive(value: Optional[str]) -> Optional[int]:
    value = (value or "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


def local_world_size(environ=os.environ) -> Optional[int]:
    """The number of ranks on this node: torchrun's LOCAL_WORLD_SIZE, DeepSpeed's launcher's
    LOCAL_SIZE, Open MPI's OMPI_COMM_WORLD_LOCAL_SIZE, or, under srun, this node's share of
    SLURM_TASKS_PER_NODE (SLURM_NTASKS_PER_NODE where the job gave one); None outside them."""
    for name in ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        found = _positive(environ.get(name))
        if found is not None:
            return found
    if "SLURM_PROCID" not in environ:        # a Slurm allocation, but not a task srun started
        return None
    per_node = _positive(environ.get("SLURM_NTASKS_PER_NODE"))
    if per_node is not None:
        return per_node
    node_id = _positive(environ.get("SLURM_NODEID")) or 0
    return slurm_tasks_on_node(environ.get("SLURM_TASKS_PER_NODE", ""), node_id)


def rank(environ=os.environ) -> Optional[str]:
    """This process's rank in its job: torchrun's and DeepSpeed's RANK, srun's SLURM_PROCID
    (a task srun started), Open MPI's OMPI_COMM_WORLD_RANK, MPICH's and Intel MPI's PMI_RANK;
    None outside a job."""
    for name in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        value = environ.get(name, "").strip()
        if value.isdigit():
            return value
    return None
