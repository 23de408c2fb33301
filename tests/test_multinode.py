"""Past one machine: CUDA trainers launched across two nodes, each a network namespace of its own
with its own address and host name (tests/cluster.py), as torchrun, Slurm and job scripts
written for NCCL launch them; and the faults a multi-node job must survive or end on."""

import fcntl
import json
import signal
import sys
from pathlib import Path

import pytest
import torch

import cluster
from conftest import ROOT, _clean_env, torchrun

pytestmark = pytest.mark.skipif(cluster.why_not() is not None, reason=str(cluster.why_not()))

TRAINER = str(ROOT / "tests" / "programs" / "elastic_ddp.py")
# What a job script for NCCL sets on every node; gloo must bind to the node's interface.
JOB_ENV = {"NCCL_SOCKET_IFNAME": cluster.INTERFACE, "NCCL_DEBUG": "WARN", "NCCL_IB_DISABLE": "1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"}
RDZV_PORT, MASTER_PORT = "29400", "29500"


def shimmed_torchrun(*options):
    return [sys.executable, "-m", "cudashim", "-m", "torch.distributed.run", *options]


def c10d_node(node, nodes=2, nproc=2, *, restarts=0):
    return shimmed_torchrun("--nnodes", str(nodes), "--nproc-per-node", str(nproc),
                            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"node0:{RDZV_PORT}",
                            "--rdzv-id", "job", "--max-restarts", str(restarts))


def static_node(node, nodes=2, nproc=2):
    return shimmed_torchrun("--nnodes", str(nodes), "--nproc-per-node", str(nproc), "--node-rank", str(node),
                            "--master-addr", "node0", "--master-port", MASTER_PORT)


def on_every_node(launcher, program_args, nodes=2, env=None, **launcher_options):
    return [cluster.Command(node, [*launcher(node, nodes, **launcher_options), *program_args],
                            env={**JOB_ENV, **(env or {})}, cwd=str(ROOT))
            for node in range(nodes)]


def run_cluster(commands, **options):
    return cluster.run(commands, environ=_clean_env(), **options)


def trainer_args(where: Path, *extra):
    return [TRAINER, "--snapshot", str(where / "snapshot.pt"), "--out", str(where / "final.pt"), *extra]


def once(tmp_path_factory, name, make):
    """``make(folder)`` run once for the whole test session (all xdist workers), its folder
    shared: reference runs every test compares with."""
    shared = tmp_path_factory.getbasetemp().parent / f"once-{name}"
    shared.mkdir(exist_ok=True)
    with open(shared.parent / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "done").exists():
            make(shared)
            (shared / "done").write_text("")
    return shared


@pytest.fixture
def one_node_of_four(tmp_path_factory):
    """The trainer on one node of four ranks, uninterrupted: what every layout must equal."""
    def make(folder):
        result = torchrun(*trainer_args(folder), nproc=4, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(once(tmp_path_factory, "one-node-of-four", make) / "final.pt")


def assert_same_training(final_path, reference, exact=True):
    """The same losses at every step and the same final weights: bit for bit where ``exact``,
    else within float32 rounding."""
    final = torch.load(final_path)
    assert len(final["losses"]) == len(reference["losses"]) == 3 * 512 // (4 * 8)
    if exact:
        assert final["losses"] == reference["losses"]
        for name, tensor in reference["model"].items():
            assert torch.equal(final["model"][name], tensor), name
    else:
        torch.testing.assert_close(final["losses"], reference["losses"], rtol=1e-5, atol=0)
        torch.testing.assert_close(final["model"], reference["model"], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("launcher", [c10d_node, static_node], ids=["c10d-rendezvous", "static-master-addr"])
def test_two_nodes_of_two_ranks_train_like_one_node_of_four(tmp_path, one_node_of_four, launcher):
    run = run_cluster(on_every_node(launcher, trainer_args(tmp_path),
                                    env={"CUDASHIM_REPORT_JSON": str(tmp_path / "report.json")}))
    assert run.returncodes == [0, 0], run.output()
    assert not run.left_behind, run.left_behind
    assert_same_training(tmp_path / "final.pt", one_node_of_four)
    # the job's NCCL interface became gloo's on each node, and each rank said so
    for rank in range(4):
        report = json.loads((tmp_path / f"report.rank{rank}.json").read_text())
        assert report["apis"]["$NCCL_SOCKET_IFNAME"]["became"].startswith(f"GLOO_SOCKET_IFNAME={cluster.INTERFACE}")


def fault(kind, rank, at):
    return ["--fault", kind, "--fault-rank", str(rank), "--fault-at", at]


def test_a_worker_killed_mid_epoch_restarts_the_job_which_resumes_from_its_snapshot(tmp_path, one_node_of_four):
    """SIGKILL on rank 3 (node 1) in epoch 1: torchrun restarts both nodes' workers (c10d
    rendezvous, --max-restarts 1) in a new rendezvous round, whose store is the round's own
    (natively the new group reads the dead one's addresses and never forms); they resume from
    epoch 0's snapshot and end with exactly the uninterrupted run's weights."""
    run = run_cluster(on_every_node(c10d_node, trainer_args(tmp_path, *fault("kill", 3, "1:3")), restarts=1))
    assert run.returncodes == [0, 0], run.output()
    assert not run.left_behind, run.left_behind
    assert "rank 3: kill at epoch 1 step 3" in run.outcomes[1].stdout
    # node 1's agent counts a restart; node 0's restarts its workers for the new round, uncounted
    said = run.outcomes[0].stdout + run.outcomes[1].stdout
    assert all(f"rank {rank}: resumed at epoch 1 (attempt" in said for rank in range(4)), said
    final = torch.load(tmp_path / "final.pt")
    assert final["losses"][:16] == one_node_of_four["losses"][:16]       # epoch 0, from the snapshot
    # Within rounding after that: the restarted DDP lays its gradient bucket out afresh before
    # its first step (the uninterrupted one had re-laid it by readiness after its first), and
    # which rank starts each element's sum in gloo's ring follows the layout, as in NCCL's.
    assert_same_training(tmp_path / "final.pt", one_node_of_four, exact=False)


def test_a_rank_that_raises_fails_every_node_with_its_traceback(tmp_path):
    run = run_cluster(on_every_node(c10d_node, trainer_args(tmp_path, "--timeout", "20",
                                                            *fault("raise", 3, "0:2"))), timeout=200)
    assert None not in run.returncodes, "a node was still running at the deadline:\n" + run.output()
    assert 0 not in run.returncodes, run.output()
    assert "RuntimeError: rank 3 failed at epoch 0 step 2" in run.outcomes[1].stderr
    assert not run.left_behind, run.left_behind
    assert not (tmp_path / "final.pt").exists()


def test_ranks_left_waiting_in_a_collective_time_out_and_end_the_job(tmp_path):
    """Rank 3 stops taking part; ranks 0-2 wait in DDP's gradient allreduce until the timeout
    the program gave init_process_group (15 s), raise, and both nodes end non-zero: the hung
    rank is stopped with its node, nothing is left running."""
    run = run_cluster(on_every_node(c10d_node, trainer_args(tmp_path, "--timeout", "15",
                                                            *fault("hang", 3, "0:2"))), timeout=200)
    assert None not in run.returncodes, "a node was still running at the deadline:\n" + run.output()
    assert 0 not in run.returncodes, run.output()
    assert "rank 3: hang at epoch 0 step 2" in run.outcomes[1].stdout
    assert not run.left_behind, run.left_behind
