"""Past one machine: CUDA trainers launched across two nodes, each a network namespace of its own
with its own address and host name (tests/cluster.py), as torchrun, Slurm and job scripts
written for NCCL launch them; and the faults a multi-node job must survive or end on."""

import json
import sys
from pathlib import Path

import pytest
import torch

import cluster
from conftest import ROOT, _clean_env, once, torchrun

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
    """torchrun's static rendezvous: every node names the master and its own rank."""
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


def test_a_program_started_on_a_node_lives_on_that_node():
    """Its host name and address are the node's, as are those of what it starts; where the suite
    forks its programs, each node's are forked from a zygote of that node's (tests/cluster.py). A
    zygote client of another place (this worker's) starts its program afresh on the node."""
    import zygote
    probe = ("import socket, subprocess, sys; name = socket.gethostname(); "
             "print(name, socket.gethostbyname(name), sys.executable); sys.stdout.flush(); "
             "subprocess.run([sys.executable, '-c', 'import socket; print(socket.gethostname())'])")
    run = run_cluster([cluster.Command(node, [interpreter, "-c", probe], cwd=str(ROOT))
                       for node, interpreter in ((0, sys.executable), (1, sys.executable), (1, zygote.executable()))])
    assert run.returncodes == [0, 0, 0], run.output()
    assert not run.left_behind, run.left_behind
    forked = zygote.executable() != sys.executable
    for (node, expected), outcome in zip(((0, forked), (1, forked), (1, False)), run.outcomes):
        (name, address, interpreter), (child,) = (line.split() for line in outcome.stdout.splitlines())
        assert (name, address, child) == (cluster.node_name(node), cluster.node_address(node), name)
        assert (interpreter != sys.executable) == expected, (node, interpreter)



def test_a_program_started_on_another_node_through_pdsh_is_forked_from_that_nodes_zygote(tmp_path):
    """pdsh (tests/fakes/bin/pdsh, as DeepSpeed's multi-node runner calls it) runs this node's
    ``sys.executable`` on another node, in a login environment given the job's exports (DeepSpeed
    exports PYTHON*, the suite's programs' thread count is a job's own). The
    program lives on that node and, where the suite forks its programs, is forked from that
    node's zygote (every node's zygote names the others by host name), not started afresh."""
    import zygote
    from conftest import FAKES
    starter = tmp_path / "start_on_node1.py"
    starter.write_text(
        "import os, shlex, subprocess, sys\n"
        "shown = 'import socket, sys; print(socket.gethostname(), sys.executable)'\n"
        "exports = ''.join(f'export {name}={shlex.quote(value)}; ' for name, value in os.environ.items()\n"
        "                  if name.startswith('PYTHON') or name == 'OMP_NUM_THREADS')   # as DeepSpeed's runner\n"
        "print(sys.executable, flush=True)\n"
        "subprocess.run(['pdsh', '-w', 'node1', f'{exports}cd {os.getcwd()}; {sys.executable} -c {shlex.quote(shown)}'],\n"
        "               check=True)\n")
    run = run_cluster([cluster.Command(0, [sys.executable, str(starter)], cwd=str(ROOT),
                                       env={"PATH": f"{FAKES / 'bin'}:{_clean_env()['PATH']}"})], reached=[1])
    assert run.returncodes == [0], run.output()
    assert not run.left_behind, run.left_behind
    starters, line = run.outcomes[0].stdout.splitlines()
    host, name, interpreter = line.split()
    assert (host, name) == ("node1:", "node1")
    if zygote.executable() == sys.executable:        # --fresh-interpreters: every program afresh
        assert interpreter == starters == sys.executable
    else:                                            # node1's own client, not node0's or none
        assert interpreter not in (sys.executable, starters), (interpreter, starters)


def test_two_nodes_of_two_ranks_train_like_one_node_of_four(tmp_path, one_node_of_four):
    """Under torchrun's c10d rendezvous. Its static form (``--master-addr``, ``--node-rank``)
    starts the eight-rank job on the test accelerator and the compressed allreduce's nodes below."""
    run = run_cluster(on_every_node(c10d_node, trainer_args(tmp_path),
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


def failed_job(commands):
    """The run of a job that must fail: every node ended on its own (none was still running at
    the deadline, far past the program's timeout), none with success, nothing left running."""
    run = run_cluster(commands, timeout=200)
    assert None not in run.returncodes, "a node was still running at the deadline:\n" + run.output()
    assert 0 not in run.returncodes, run.output()
    assert not run.left_behind, run.left_behind
    return run


def test_a_rank_that_raises_fails_every_node_with_its_traceback(tmp_path):
    """Rank 1 (node 1's only rank) raises: node 1 ends with its traceback, and rank 0, whose
    peer is gone mid-allreduce, fails node 0 well before the program's 20 s timeout."""
    run = failed_job(on_every_node(c10d_node, trainer_args(tmp_path, "--timeout", "20",
                                                           *fault("raise", 1, "0:2")), nproc=1))
    assert "RuntimeError: rank 1 failed at epoch 0 step 2" in run.outcomes[1].stderr
    assert "Connection closed by peer" in run.outcomes[0].stderr, run.output()
    assert not (tmp_path / "final.pt").exists()


def test_ranks_left_waiting_in_a_collective_time_out_and_end_the_job(tmp_path):
    """Rank 3 stops taking part; ranks 0-2 wait in DDP's gradient allreduce until the timeout
    the program gave init_process_group (10 s), raise, and both nodes end non-zero: the hung
    rank is stopped with its node, nothing is left running."""
    run = failed_job(on_every_node(c10d_node, trainer_args(tmp_path, "--timeout", "10",
                                                           *fault("hang", 3, "0:2"))))
    assert "rank 3: hang at epoch 0 step 2" in run.outcomes[1].stdout
    # what ended it: the program's own timeout, in gloo's words, on the ranks left waiting
    assert "Timed out waiting 10000ms" in run.outcomes[0].stderr, run.output()


def srun_tasks(program_args, nodes=2, per_node=2, env=None):
    """What ``srun --nodes N --ntasks-per-node M python -m cudashim ...`` starts: one task per
    rank, told where it sits by Slurm's variables; the job script exports MASTER_ADDR."""
    layout = {"SLURM_NTASKS": str(nodes * per_node), "SLURM_NNODES": str(nodes), "SLURM_JOB_ID": "4242",
              "SLURM_TASKS_PER_NODE": f"{per_node}(x{nodes})", "SLURM_JOB_NODELIST": f"node[0-{nodes - 1}]",
              "MASTER_ADDR": "node0", "MASTER_PORT": MASTER_PORT}
    return [cluster.Command(node, [sys.executable, "-m", "cudashim", *program_args],
                            env={**JOB_ENV, **layout, **(env or {}), "SLURM_NODEID": str(node),
                                 "SLURM_PROCID": str(node * per_node + local), "SLURM_LOCALID": str(local)},
                            cwd=str(ROOT))
            for node in range(nodes) for local in range(per_node)]


def test_srun_tasks_read_slurms_variables_and_train_like_one_node_of_four(tmp_path, one_node_of_four):
    run = run_cluster(srun_tasks(trainer_args(tmp_path), env={"CUDASHIM_REPORT_JSON": str(tmp_path / "report.json")}))
    assert run.returncodes == [0, 0, 0, 0], run.output()
    assert not run.left_behind, run.left_behind
    assert_same_training(tmp_path / "final.pt", one_node_of_four)
    for rank in range(4):                # a report per task, named by its SLURM_PROCID
        assert json.loads((tmp_path / f"report.rank{rank}.json").read_text())["rank"] == str(rank)


def test_eight_ranks_on_two_nodes_of_four_devices_train_like_one_process(tmp_path):
    """Two nodes of four ranks on cudashim's test accelerator (four devices a node, memory of
    their own; NCCL becomes its collective library beside gloo). The ranks' batches of 8 make up
    one process's batch of 64 step by step, so the eight ranks train as one process does."""
    from targets import SHIMDEV
    if SHIMDEV.why_not is not None:
        pytest.skip(SHIMDEV.why_not)

    def shimdev_node(node, nodes, nproc):
        return [sys.executable, "-m", "cudashim", "--test-devices", "4", *static_node(node, nodes, nproc)[3:]]

    run = run_cluster(on_every_node(shimdev_node, trainer_args(tmp_path), nproc=4), timeout=300)
    assert run.returncodes == [0, 0], run.output()
    assert not run.left_behind, run.left_behind
    (tmp_path / "one").mkdir()
    one = torchrun(*trainer_args(tmp_path / "one", "--batch-size", "64"), nproc=1, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    # saved from shimdev's memory, tagged shimdev:0 as an XPU's checkpoint is tagged xpu:0
    eight = torch.load(tmp_path / "final.pt", map_location="cpu")
    single = torch.load(tmp_path / "one" / "final.pt")
    assert len(eight["losses"]) == 3 * 512 // 64
    torch.testing.assert_close(eight["losses"], single["losses"], rtol=1e-4, atol=0)
    torch.testing.assert_close(eight["model"], single["model"], rtol=1e-4, atol=1e-6)


def test_the_compressed_allreduce_across_a_shaped_link_computes_what_it_does_on_one_node(tmp_path):
    """examples/onebit_adam.py (1-bit Adam: Adam's warm-up, then momentum averaged through
    cudashim's 1-bit compressed allreduce) on two nodes joined by a 1 Gbit/s link, against the
    same two ranks on one node: the same evaluation losses, bit for bit."""
    example = [str(ROOT / "examples" / "onebit_adam.py"), "--steps", "40", "--warmup", "10"]
    # One thread per rank on both sides, as torchrun gives two ranks on one node: torch's CPU
    # matmuls reduce in another order on another thread count (weight gradients differ in the
    # last bit on AVX-512 hosts), which is torch's, not the allreduce's.
    one_thread = {**JOB_ENV, "OMP_NUM_THREADS": "1"}
    run = run_cluster([cluster.Command(node, [*static_node(node, nodes=2, nproc=1), *example,
                                              "--losses", str(tmp_path / "nodes.json")],
                                       env=one_thread, cwd=str(ROOT)) for node in (0, 1)], rate="1gbit")
    assert run.returncodes == [0, 0], run.output()
    one = torchrun(*example, "--losses", str(tmp_path / "one.json"), nproc=2)
    assert one.returncode == 0, one.stderr[-3000:]
    nodes, single = (json.loads((tmp_path / name).read_text()) for name in ("nodes.json", "one.json"))
    assert len(nodes) >= 2 and nodes[-1] < nodes[0]
    assert nodes == single
