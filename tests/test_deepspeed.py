"""Real DeepSpeed programs written for CUDA, run unmodified under ``python -m cudashim``.

DeepSpeed is not in the suite's environment; tox's ``frameworks`` environment installs a
release that still ships the 1-bit optimizers (0.16.9) and runs this file. DeepSpeed builds
its CPU ops (shared-memory allreduce, fused Adam, CPU Adam) with the compiler on first use.
"""

import json
from pathlib import Path

import pytest

from conftest import ROOT, free_port, python

pytest.importorskip("deepspeed")

PROGRAM = str(ROOT / "tests" / "programs" / "deepspeed_train.py")
BACKENDS = str(ROOT / "tests" / "programs" / "onebit_backend.py")
BUILDS = 1200                        # the first run may build DeepSpeed's CPU ops


def _one_rank(tmp_path, *options, shim=("-m", "cudashim"), program=PROGRAM, env=()):
    port = free_port()
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), **dict(env)}
    out = tmp_path / "out.json"
    try:
        result = python(*shim, program, *options, "--checkpoint", str(tmp_path / "checkpoints"),
                        "--out", str(out), env=env, timeout=BUILDS)
        assert result.returncode == 0, result.stderr[-4000:]
        if shim:
            assert not _shared_buffers(port)
    finally:
        for buffer in _shared_buffers(port):       # DeepSpeed's own leak, unshimmed or killed
            buffer.unlink(missing_ok=True)
    return json.loads(out.read_text())


def _two_ranks(tmp_path, *options, program=PROGRAM):
    out = tmp_path / "out.json"
    if program == PROGRAM:
        options += ("--checkpoint", str(tmp_path / "checkpoints"))
    port = free_port()
    try:
        result = python("-m", "cudashim", "-m", "deepspeed.launcher.runner", "--num_gpus", "2",
                        "--master_port", str(port), program, *options, "--out", str(out), timeout=BUILDS)
        assert result.returncode == 0, result.stderr[-4000:]
        assert not _shared_buffers(port)
    finally:
        for buffer in _shared_buffers(port):
            buffer.unlink(missing_ok=True)
    return json.loads(out.read_text())


def _shared_buffers(port):
    """DeepSpeed's CPU allreduce buffers of a run (66 MiB a rank, named by its master port),
    which the shim unlinks at exit: left behind, each run keeps them in host memory."""
    return sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))


def _check(seen, dtype, world_size):
    # DeepSpeed ran its own CPU accelerator and gloo; the program heard its CUDA words
    assert seen["accelerator"] == "cpu" and seen["communication"] == "gloo"
    assert seen["backend"] == "nccl" and seen["world_size"] == world_size
    assert seen["parameter"] == ["cpu", f"torch.{dtype}", True]
    assert all(loss == loss and loss < 10 for loss in seen["losses"])       # finite, trained
    # the checkpoint resumes exactly where it was saved: the same two steps, the same losses
    assert seen["resumed"] == seen["continued"]


@pytest.mark.parametrize("stage, dtype, options", [
    (1, "float16", ("--dtype", "fp16")),
    (3, "float16", ("--dtype", "fp16", "--offload-states")),
])
def test_zero_on_one_rank(tmp_path, stage, dtype, options):
    seen = _one_rank(tmp_path, "--stage", str(stage), *options)
    _check(seen, dtype, world_size=1)
    if "--offload-states" in options:
        assert seen["after_reload"] is not None


def test_bf16_under_the_shim_equals_the_hand_port_on_deepspeeds_cpu_accelerator(tmp_path):
    """The same program with its CUDA words removed by hand (DS_ACCELERATOR=cpu, gloo) gives
    the same losses bit for bit: the shim adds nothing to what DeepSpeed computes."""
    source = open(PROGRAM).read()
    port = (source.replace(".cuda()", "").replace("    torch.cuda.set_device(args.local_rank)\n", "")
            .replace('dist_backend="nccl"', 'dist_backend="gloo"'))
    assert ".cuda()" not in port and "torch.cuda." not in port and 'dist_backend="nccl"' not in port
    ported = tmp_path / "ported.py"
    ported.write_text(port)
    (tmp_path / "shim").mkdir()
    (tmp_path / "port").mkdir()
    options = ("--stage", "2", "--dtype", "bf16")
    shimmed = _one_rank(tmp_path / "shim", *options)
    native = _one_rank(tmp_path / "port", *options, shim=(), program=str(ported),
                       env={"DS_ACCELERATOR": "cpu"})
    assert shimmed["losses"] == native["losses"] and shimmed["resumed"] == native["resumed"]


@pytest.mark.slow
@pytest.mark.parametrize("stage, dtype, options", [
    (3, "float16", ("--dtype", "fp16", "--offload-states")),
    (2, "bfloat16", ("--dtype", "bf16", "--offload-optimizer")),
])
def test_zero_on_two_ranks_with_the_deepspeed_launcher(tmp_path, stage, dtype, options):
    seen = _two_ranks(tmp_path, "--stage", str(stage), *options)
    _check(seen, dtype, world_size=2)


def test_the_one_bit_backends_agree_with_the_torch_simulation(tmp_path):
    """DeepSpeed's NCCL backend (served on cudashim.kernels: CuPy cannot run here) and its
    compressed backend (DeepSpeed's code, with cudashim's packbits op) each compress a
    padded buffer on two ranks as a float32 simulation of the algorithm says; the long
    buffer's simulated norms are off by 1e-4 where torch's CPU kernels reduce it whole."""
    seen = _two_ranks(tmp_path, program=BACKENDS)
    assert {name.split(",")[0]: backend["module"] for name, backend in seen.items()} == {
        "NcclBackend": "cudashim.patches.frameworks.deepspeed_onebit",
        "CompressedBackend": "deepspeed.runtime.comm.compressed"}
    assert len(seen) == 4                    # a short buffer and a long one, each
    for backend in seen.values():
        assert backend["result"] < 1e-6 and backend["worker_error"] < 1e-6 and backend["server_error"] < 1e-6
        assert backend["shape_kept"] and backend["device"] == "cpu" and backend["is_cuda"]


ONE_BIT = ("OneBitAdam", "ZeroOneAdam", "OneBitLamb")


@pytest.mark.slow
def test_one_bit_optimizers_train_with_the_nccl_backend(tmp_path):
    """fp16, two ranks, comm_backend_name "nccl" as GPU programs write it; compression
    starts at the fourth step. DeepSpeed's "compressed" backend (its own allreduce, our
    packbits op) gives the same losses bit for bit. The three optimizers train one after
    another in each launch, as a sweep would."""
    runs = {}
    for backend in ("nccl", "compressed"):
        (tmp_path / backend).mkdir()
        runs[backend] = _two_ranks(tmp_path / backend, "--stage", "0", "--dtype", "fp16", "--steps", "6",
                                   "--optimizer", ",".join(ONE_BIT), "--comm-backend", backend)["runs"]
    for optimizer in ONE_BIT:
        nccl, compressed = runs["nccl"][optimizer], runs["compressed"][optimizer]
        assert nccl["onebit"]["backend"] == "cudashim.patches.frameworks.deepspeed_onebit.NcclBackend"
        assert compressed["onebit"]["backend"] == "deepspeed.runtime.comm.compressed.CompressedBackend"
        assert nccl["onebit"]["calls"] > 0 and nccl["onebit"]["calls"] == compressed["onebit"]["calls"]
        assert nccl["backend"] == "nccl" and nccl["parameter"] == ["cpu", "torch.float16", True]
        assert all(loss == loss and loss < 10 for loss in nccl["losses"] + nccl["continued"])
        assert nccl["losses"] == compressed["losses"] and nccl["continued"] == compressed["continued"]
        # A resumed 1-bit optimizer starts its error feedback afresh (DeepSpeed resets it on
        # load), so only the first resumed step, taken before any update, repeats exactly.
        assert nccl["resumed"][0] == nccl["continued"][0], optimizer


def test_the_multi_node_runner_with_a_hostfile_across_two_nodes(tmp_path):
    """`deepspeed --hostfile` on two nodes of two slots (tests/cluster.py), its pdsh runner
    reaching each node as ssh would: a login environment holding only what the runner exports
    (and the locale, which ssh sends).
    Every node's ranks come up shimmed and bind gloo to the job's NCCL interface; ZeRO-2
    across the four ranks trains and resumes its checkpoint."""
    import shutil
    import sys

    import cluster
    if cluster.why_not() is not None:
        pytest.skip(cluster.why_not())
    from conftest import FAKES, _clean_env
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    out = tmp_path / "out.json"
    runner = [sys.executable, "-m", "cudashim", shutil.which("deepspeed", path=str(Path(sys.executable).parent)),
              "--hostfile", str(hostfile), "--master_addr", "node0", "--master_port", "29500", "--no_ssh_check",
              PROGRAM, "--stage", "2", "--checkpoint", str(tmp_path / "checkpoints"), "--out", str(out)]
    environ = _clean_env()
    environ["PATH"] = f"{FAKES / 'bin'}:{environ['PATH']}"
    # What a job hands its nodes beside DeepSpeed's exports: where the ops are built, and the
    # job's PATH, so that the nodes build them with the job's ninja. A login PATH finds another
    # one (the system's 1.11 beside the environment's 1.13), whose log reads every command as
    # changed: each switch rebuilt the ops (about 90 s here). And the suite's one thread a
    # program (tests/suite_run.py), which the nodes' launchers and ranks would not have heard.
    environ["DS_ENV_FILE"] = str(tmp_path / "deepspeed_env")
    exports = {name: environ[name] for name in ("TORCH_EXTENSIONS_DIR", "PATH", "OMP_NUM_THREADS")
               if environ.get(name)}
    (tmp_path / "deepspeed_env").write_text("".join(f"{name}={value}\n" for name, value in exports.items()))
    run = cluster.run([cluster.Command(0, runner, env={"NCCL_SOCKET_IFNAME": cluster.INTERFACE,
                                                       "CUDASHIM_REPORT_JSON": str(tmp_path / "report.json")},
                                       cwd=str(ROOT))], environ=environ, timeout=BUILDS, reached=[0, 1])
    assert run.returncodes == [0], run.output(6000)
    assert not run.left_behind, run.left_behind
    seen = json.loads(out.read_text())
    _check(seen, "float16", world_size=4)
    for rank in range(4):                          # each node's ranks heard the job's interface
        report = json.loads((tmp_path / f"report.rank{rank}.json").read_text())
        assert report["apis"]["$NCCL_SOCKET_IFNAME"]["became"].startswith(f"GLOO_SOCKET_IFNAME={cluster.INTERFACE}")
    said = run.outcomes[0].stdout + run.outcomes[0].stderr
    assert "node0: " in said and "node1: " in said
