"""CUDA programs on targets with device memory of their own, compared with the CPU backend.

On the CPU backend every tensor already sits in host memory, so a copy cudashim forgot, a
wrong device or a host-only path cannot fail. Here they do, on two targets:

- **torchvulkan** (PyPI), a real PrivateUse1 accelerator nobody here wrote, over Mesa's software
  Vulkan driver ("llvmpipe"): one device, no collective library, streams or events of its own
  (cudashim supplies them); ``.numpy()`` is refused and ``.cpu()`` copies.
- **shimdev**, cudashim's test accelerator (``--test-devices 2``): two devices whose memory the
  host cannot read or write outside the device's kernels (a missed copy is a SIGSEGV), a
  generator, streams and events per device, and a collective library of its own (``shimccl``).

Each test runs its program once on the CPU backend and then on every target that runs here;
a target that cannot (no Vulkan driver, no compiler) is named in a warning, and a test with no
target left skips. The programs whose class is device memory alone (the stand-ins, generation,
QLoRA, the Trainer, recurrent cells, DataParallel over two devices, torch.compile) run on the
test accelerator only: on llvmpipe each costs tens of seconds, and torchvulkan's part in them (its
missing streams, events and collectives, one device shared) is proven by the others.
"""

import json
import math
from importlib.metadata import version
from typing import Optional

import pytest

from conftest import free_port, python, torchrun
from targets import SHIMDEV, TARGETS, VULKAN, Target, targets

for _target in TARGETS:         # probed once per worker, before the tests fork
    _target.why_not
ON_THE_TEST_ACCELERATOR = dict(where=lambda target: target is SHIMDEV)     # see the module's docstring


def _run(*args, target: Optional[Target] = None, timeout=600):
    """``python -m cudashim`` on ``target``, or on the CPU backend (None)."""
    result = python("-m", "cudashim", *(target.options if target else ()), *args, timeout=timeout)
    assert result.returncode == 0, f"{target.name if target else 'cpu'}: {result.stderr[-4000:]}"
    return result


def _doctor(*options):
    result = python("-c", "from cudashim.cli import main; main()", "doctor", *options)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.host                   # the CPU's float16 autocast follows the precision policy
@pytest.mark.torch_range
def test_a_cuda_program_sees_cuda_with_memory_of_its_own(tmp_path):
    """Copies, pinned non-blocking transfers, events and streams, generators, AMP with a
    scaler, checkpoints saved on the device and loaded on the host and the other way,
    TorchScript, DataLoader workers with pinned batches (tests/programs/device_semantics.py)."""
    def semantics(target):
        name = target.name if target else "cpu"
        _run("tests/programs/device_semantics.py", str(tmp_path / f"{name}.json"), str(tmp_path / f"{name}.pt"),
             target=target)
        return json.loads((tmp_path / f"{name}.json").read_text())

    cpu = semantics(None)
    assert cpu["host_readable"] is True
    for target in targets():
        seen = semantics(target)
        assert seen["host_readable"] is False and seen["device_index"] == 0, target.name
        assert seen["device_count"] == target.devices and seen["memory_allocated"] > 0
        assert seen["loader_sum"] == cpu["loader_sum"] == 120
        # float16 autocast on the device, the CPU's fast dtype on the host: the same first loss
        assert seen["amp_losses"][0] == pytest.approx(cpu["amp_losses"][0], rel=1e-3), target.name
        assert all(loss == loss for loss in seen["amp_losses"]) and seen["amp_losses"][-1] < seen["amp_losses"][0]

        doctor = _doctor(*target.options)
        assert f"chosen backend: accelerator '{target.name}'" in doctor
        assert target.collective in doctor


MISSED_COPY = """
import ctypes, torch
x = torch.full((4,), 7, dtype=torch.uint8).cuda()
assert torch.cuda.memory_allocated() > 0
print("read", list(ctypes.string_at(x.data_ptr(), 4)), flush=True)   # host code, no copy
"""


def test_the_test_accelerator_faults_host_code_that_reads_device_memory_without_a_copy():
    """What the CPU backend cannot show: a pointer to device memory handed to host code. On
    CUDA the read faults (or reads garbage); on the test accelerator it is a SIGSEGV."""
    (target,) = targets(where=lambda target: target is SHIMDEV)
    assert "read [7, 7, 7, 7]" in _run("-c", MISSED_COPY).stdout
    faulted = python("-m", "cudashim", *target.options, "-c", MISSED_COPY)
    assert faulted.returncode == -11 and "read" not in faulted.stdout, faulted.stderr[-2000:]


@pytest.mark.torch_range
@pytest.mark.parametrize("default_device", [False, True], ids=["plain", "set_default_device"])
def test_a_script_that_ends_in_a_backward_exits_cleanly_on_a_busy_machine(default_device):
    """The device's autograd thread lets go of the last backward before the interpreter ends
    (cudashim/autograd_exit.py); without that, ``terminate called without an active exception``
    and SIGABRT in most runs of this program (tests/programs/exit_after_backward.py)."""
    options = ("--default-device",) if default_device else ()
    for target in (None, *targets()):
        result = _run("tests/programs/exit_after_backward.py", *options, target=target)
        assert "saliency of (8, 16)" in result.stdout and "terminate" not in result.stderr


@pytest.mark.host                   # the CPU's float16 autocast follows the precision policy
@pytest.mark.torch_range
def test_the_gpt_example_trains_checkpoints_and_resumes_as_on_the_cpu(tmp_path):
    """Events time its steps; the checkpoint is saved on the device and restored."""
    def losses(target):
        name = target.name if target else "cpu"
        run = _run("examples/gpt.py", "--steps", "3", "--checkpoint", str(tmp_path / name / "ckpt.pt"),
                   "--losses", str(tmp_path / f"{name}.json"), target=target)
        assert "3 steps in" in run.stdout and "restored" in run.stdout      # timed with events
        return json.loads((tmp_path / f"{name}.json").read_text())

    on_cpu = losses(None)
    for target in targets():
        on_target = losses(target)
        assert on_target == pytest.approx(on_cpu, rel=5e-3), target.name
        assert on_target[-1] < on_target[0]


def test_the_convnet_recipe_with_amp_and_a_stream_prefetcher_trains_as_on_the_cpu(tmp_path):
    """NVIDIA's ConvNets recipe at toy size (tests/programs/convnet_recipe.py): uint8 batches
    normalized on a side stream, a channels-last ResNet, float16 autocast with a dynamic
    GradScaler; then the same model from the same weights through TorchScript under autocast,
    as the recipe's EfficientNet runs with --jit script. Each target learns what the CPU learns,
    within the rounding of the reduced precision each computes in (the CPU and the test
    accelerator take the host's choice, torchvulkan float16). Before the torchscript group ran
    graphs unoptimized on such devices, the scripted model failed in linear's backward on both
    ("expected m1 and m2 to have the same dtype")."""
    def trained(target):
        name = target.name if target else "cpu"
        _run("tests/programs/convnet_recipe.py", str(tmp_path / f"{name}.json"), "--script", "--steps", "4",
             target=target)
        seen = json.loads((tmp_path / f"{name}.json").read_text())
        assert seen["device"] == (target.device(0) if target else "cpu") and seen["is_cuda"], seen
        assert seen["channels_last"], seen
        assert seen["scripted_losses"] == pytest.approx(seen["losses"], rel=1e-2), name
        return seen["losses"]

    on_cpu = trained(None)
    for target in targets():
        assert trained(target) == pytest.approx(on_cpu, rel=3e-2), target.name


@pytest.mark.torch_range
def test_ddp_on_two_ranks_trains_as_on_the_cpu(tmp_path):
    """NCCL becomes the target's library (collectives staged through host memory on vulkan,
    shimccl on the test accelerator); each rank's set_device(local_rank) lands on its device
    (both on vulkan's one). On the targets the optimizer's state is sharded over the ranks
    (ZeroRedundancyOptimizer, as llm.c's GPT-2 trainer shards it) and gathered on rank 0 at the
    end: its steps train as plain DDP's on the CPU."""
    import torch

    def weights(target):
        name = target.name if target else "cpu"
        result = torchrun("tests/programs/ddp_train.py", "--epochs", "1", "--batch-size", "32",
                          "--out", str(tmp_path / f"{name}.pt"), *(("--zero",) if target else ()),
                          shim_options=target.options if target else (), timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        return torch.load(tmp_path / f"{name}.pt", map_location="cpu")      # tagged with the device

    on_cpu = weights(None)
    for target in targets():
        on_target = weights(target)
        assert on_target.keys() == on_cpu.keys()
        for key in on_cpu:
            torch.testing.assert_close(on_target[key], on_cpu[key], rtol=1e-5, atol=1e-6, msg=target.name)


# torch 2.4's FSDP2 (torch.distributed._composable.fsdp), written for CUDA alone, stops at the
# first backward under cudashim on every target: the all-gather's copy-out into a parameter already
# saved for backward bumps its version ("modified by an inplace operation", AsStridedBackward0).
FSDP2_OFF_CUDA_FAILS = tuple(int(part) for part in version("torch").split(".")[:2]) < (2, 5)


@pytest.mark.torch_range
@pytest.mark.xfail(FSDP2_OFF_CUDA_FAILS, strict=True, reason="torch 2.4's FSDP2 off CUDA (above)")
def test_fsdp_and_a_device_mesh_on_two_ranks_with_one_device_each(tmp_path):
    """FSDP frees and regrows its flat parameters' storages in device memory, and offloads
    its full state dict with .cpu(); HSDP's all-reduce over replicas, and FSDP1's float16
    ShardedGradScaler moving found-inf flags between host and device. torchvulkan cannot: its storage resize_(0) moves the
    storage to the host. On the CPU too, where FSDP2 takes its streams from ``torch.cpu``, whose
    ``record_event()`` answers None: torch 2.7 stopped HSDP at its first backward there."""
    for target in [None, *targets(where=lambda target: target.devices >= 2)]:
        mesh = torchrun("tests/programs/mesh_fsdp.py", shim_options=target.options if target else (), timeout=300)
        assert mesh.returncode == 0, mesh.stderr[-3000:]
        for rank in (0, 1):
            assert f"rank {rank}: mesh on {target.name if target else 'cpu'}, fully_shard and FSDP trained" \
                in mesh.stdout
            assert f"rank {rank}: HSDP over 2 replicas steps as one device" in mesh.stdout
            assert f"rank {rank}: ShardedGradScaler on torch.float16, stepped [True, False], scale 128.0" \
                in mesh.stdout
        if target is None:
            continue                   # the CPU's state dict: test_multiprocess.py
        state = torchrun("tests/programs/fsdp_state_dict.py", str(tmp_path / "state.json"),
                         shim_options=target.options, timeout=300)
        assert state.returncode == 0, state.stderr[-3000:]
        assert json.loads((tmp_path / "state.json").read_text()) == {"names": True, "equal": True}


@pytest.mark.torch_range
def test_pipeline_schedules_train_as_the_unsplit_model(tmp_path):
    """torch.distributed.pipelining's schedules (GPipe, 1F1B, interleaved 1F1B) on two ranks:
    each rank sends before it receives, which a collective library that completes a send only
    when the peer receives it turns into a wait forever; the receive buffers are leaves that
    require grad from the second step on; torch 2.7's schedules wait on the last work of a batch
    alone, which NCCL makes one work. Losses and weights as the unsplit model's."""
    for target in [None, *(target for target in TARGETS if target.why_not is None)]:
        out = tmp_path / f"{target.name if target else 'cpu'}.json"
        result = torchrun("tests/programs/pipeline_schedules.py", str(out),
                          shim_options=target.options if target else (), timeout=300)
        assert result.returncode == 0, f"{target.name if target else 'cpu'}: {result.stderr[-4000:]}"
        for schedule, seen in json.loads(out.read_text()).items():
            assert seen["losses"] == pytest.approx(seen["reference"], rel=1e-5), (target, schedule)
            assert seen["weights_equal"], (target, schedule)


def _mesh_run(tmp_path, name, *args, nproc, target: Optional[Target]):
    out = tmp_path / f"{name}.json"
    result = torchrun("tests/programs/mesh_parallel.py", str(out), *args, nproc=nproc,
                      shim_options=target.options if target else (), timeout=400)
    assert result.returncode == 0, f"{target.name if target else 'cpu'} {name}: {result.stderr[-4000:]}"
    return json.loads(out.read_text())


def _assert_dtensor_ops(seen):
    # DTensor's all-to-all, rows to columns: gloo before torch 2.7, under a target's staged
    # collectives, has none ("Backend gloo does not support alltoall"): an all-gather and a slice
    assert seen["resharded"] is True, seen
    rng = seen["rng"]
    assert rng["replicated_equal"] and rng["in_step"], rng          # replicas agree, generators in step
    assert rng["shards_differ"] and rng["dropout_shards_differ"], rng
    assert rng["dropout_replicas_equal"], rng
    assert 0.3 < rng["dropout_kept"] < 0.7 and abs(rng["normal_mean"]) < 0.5, rng
    # attention on DTensors: torch shards only CUDA's attention kernels; the host's flash kernel
    # has no sharding strategy and a device's math path meets a plain causal mask
    attention = seen["attention"]
    assert attention["batch_and_heads"]["placements"] == ["S(0)", "S(1)"], attention
    assert attention["per_head_mask"]["placements"] == ["S(0)", "S(1)"], attention
    assert attention["sequence"]["placements"] == ["R", "R"], attention          # replicated first
    assert all(case["difference"] < 1e-5 for case in attention.values()), attention
    # context parallelism: torch's ring attention runs CUDA's attention ops on each rank's part
    # of the sequence (SEQ 8 over two ranks)
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401
    except ImportError:                                      # torch before 2.5
        assert seen["context_parallel"] is None
    else:
        assert seen["context_parallel"]["tokens_per_rank"] == 4, seen["context_parallel"]
        assert seen["context_parallel"]["difference"] < 1e-5, seen["context_parallel"]


def test_the_2d_mesh_program_where_every_rank_shares_one_device(tmp_path):
    """The 2-D mesh program on torchvulkan, whose one device the four ranks share, trained,
    checkpointed and resumed as on the targets with a device per rank. Its generator is
    Philox-shaped and reached through its module's ``__getattr__`` (``default_generators``), so
    torch's own offset tracker runs on it. Before cudashim read that hook, the mesh's generator
    was taken to be the host's, seeded regions moved it, and every shard drew the same numbers
    from the device's untouched generator."""
    for target in targets(where=lambda target: target.devices < 2):
        _train_and_resume_on_a_2d_mesh(tmp_path, target)


@pytest.mark.torch_range
def test_data_and_tensor_parallel_training_on_a_2d_mesh(tmp_path):
    """The FSDP2 + TP tutorials' program on a (data, tensor) mesh of four ranks, seeded as the
    training frameworks seed it: DTensor's random ops (torch refuses the host's generator and
    the test accelerator's, which count no offsets), attention on DTensors with their heads
    sharded (torchtitan's plan; torch shards only CUDA's attention kernels), training compared with the unsharded
    model on one device, MixedPrecisionPolicy(bfloat16) with CPUOffloadPolicy, and a sharded
    checkpoint resumed by two ranks."""
    import torch.distributed.fsdp as fsdp

    runnable = [target for target in TARGETS if target.devices >= 2 and target.why_not is None]
    if not hasattr(fsdp, "fully_shard"):
        # torch before 2.6: FSDP2 composed with TP has no state dict ("2D state_dict is under
        # development"), and its embedding gradients differ from the unsharded model's
        for target in [None, *runnable]:
            seen = _mesh_run(tmp_path, target.name if target else "cpu", "--rng-only", nproc=4, target=target)
            assert seen["mesh"] == [2, 2] and seen["rng"]["device"] == (target.device(0) if target else "cpu")
            _assert_dtensor_ops(seen)
        return
    for target in [None, *runnable]:
        _train_and_resume_on_a_2d_mesh(tmp_path, target)


def _train_and_resume_on_a_2d_mesh(tmp_path, target: Optional[Target]):
    where = tmp_path / (target.name if target else "cpu")
    where.mkdir()
    trained = _mesh_run(where, "trained", "--save", str(where / "checkpoint"), "--then-mixed", nproc=4,
                        target=target)
    assert trained["mesh"] == [2, 2]
    assert trained["parameter"] == ["DTensor", target.device(0) if target else "cpu"]
    assert trained["rng"]["device"] == (target.device(0) if target else "cpu")
    _assert_dtensor_ops(trained)
    assert trained["losses"] == pytest.approx(trained["reference"], rel=1e-4)

    resumed = _mesh_run(where, "resumed", "--resume", str(where / "checkpoint"), nproc=2, target=target)
    assert resumed["mesh"] == [1, 2]
    assert resumed["rng"]["replicated"] == trained["rng"]["replicated"]   # the same seed, the same draws
    assert resumed["losses"][0] == pytest.approx(trained["losses"][3], rel=1e-5)   # the weights
    # the optimizer's state, resharded from (2, 2) to (1, 2): exact from torch 2.13, within 3e-4 on 2.7
    assert resumed["losses"] == pytest.approx(trained["losses"][3:], rel=1e-3)

    # trained again by the same ranks with MixedPrecisionPolicy(bfloat16) and CPUOffloadPolicy
    assert trained["mixed"] != trained["losses"]                          # bfloat16 computed
    assert trained["mixed"] == pytest.approx(trained["reference"], rel=3e-2)


@pytest.mark.torch_range
def test_pipeline_data_and_tensor_parallel_training_on_a_3d_mesh(tmp_path):
    """A (pp, dp, tp) mesh of four ranks, as the training frameworks compose it: two pipeline
    stages under GPipe, each stage's blocks split over tp and sharded with FSDP2 over dp. The
    losses and the weights gathered from their shards are the unsplit model's, on every target
    (torchvulkan's one device shared by the four ranks). On torch 2.7 and older its ranks hung
    in destroy_process_group at times, under load: torch destroyed a group holding the GIL that
    gloo's worker needed to free all_gather_object's tensors (cudashim lets go of it first)."""
    import torch.distributed.fsdp as fsdp

    for target in [None, *(target for target in TARGETS if target.why_not is None)]:
        name = target.name if target else "cpu"
        out = tmp_path / f"{name}.json"
        result = torchrun("tests/programs/mesh_3d.py", str(out), nproc=4,
                          shim_options=target.options if target else (), timeout=400)
        assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"
        seen = json.loads(out.read_text())
        assert seen["devices"] == sorted({target.device(rank) for rank in range(4)} if target else {"cpu"}), seen
        assert seen["losses"][0] == pytest.approx(seen["unsplit"][0], rel=1e-5), name   # the forward
        if not hasattr(fsdp, "fully_shard"):
            continue        # torch before 2.6: FSDP2 over TP trains apart from the unsplit model
        assert seen["losses"] == pytest.approx(seen["unsplit"], rel=1e-5), name
        assert seen["weights_equal"], name


@pytest.mark.torch_range
def test_the_hugging_face_trainer_trains_and_resumes(tmp_path):
    """transformers' Trainer under torchrun, two ranks, CUDA's fp16 AMP: the run resumed from
    its checkpoint repeats the uninterrupted run's losses."""
    pytest.importorskip("transformers")
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        out = tmp_path / f"{target.name}.json"
        # DDP's record of unused parameters needs pinned memory (see below)
        unused = () if target.pins_memory else ("--ddp-find-unused-parameters", "false")
        result = torchrun("tests/programs/hf_trainer.py", "--output-dir", str(tmp_path / target.name), "--out",
                          str(out), *unused, shim_options=target.options, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        seen = json.loads(out.read_text())
        assert seen["parameter"] == [target.device(0), True] and seen["wrapped"] == "DistributedDataParallel"
        assert seen["device"] == "cuda:0" and seen["scaler"] == "GradScaler"
        assert all(seen["resumed"][step] == seen["losses"][step] for step in ("4", "5", "6"))


def test_the_trainers_bf16_gate_opens_where_the_target_emulates_bfloat16(tmp_path):
    """TrainingArguments(bf16=True) asks torch.cuda.is_bf16_supported(), which CUDA answers True
    wherever it can emulate bfloat16. torchvulkan computes no bfloat16 itself (its ops fall back
    to the host), so the answer with emulation is True and without it False; the Trainer trains
    in CUDA's bf16 autocast (which the precision policy runs in float32 there) and resumes."""
    pytest.importorskip("transformers")
    for target in targets(where=lambda target: not target.bf16):
        out = tmp_path / f"{target.name}.json"
        _run("tests/programs/hf_trainer.py", "--output-dir", str(tmp_path / target.name), "--out", str(out),
             "--precision", "bf16", target=target)
        seen = json.loads(out.read_text())
        assert seen["parameter"] == [target.device(0), True] and seen["mixed_precision"] == "bf16"
        assert seen["scaler"] == "NoneType"                 # bf16 needs no loss scaling
        assert all(seen["resumed"][step] == seen["losses"][step] for step in ("4", "5", "6"))
        answers = _run("-c", "import torch; print(torch.cuda.is_bf16_supported(), "
                             "torch.cuda.is_bf16_supported(including_emulation=False))", target=target)
        assert answers.stdout.split()[-2:] == ["True", "False"]


UNUSED_PARAMETERS = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("nccl", rank=0, world_size=1)
model = torch.nn.Linear(4, 1).cuda()
for find_unused in (True, False):
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], find_unused_parameters=find_unused)
        ddp(torch.ones(2, 4, device="cuda")).sum().backward()
        print("trained", model.weight.grad.sum().item())
    except RuntimeError as error:
        print(type(error).__name__, error)
dist.destroy_process_group()
"""


def test_ddp_tracking_unused_parameters_runs_where_the_device_pins_memory_and_is_refused_where_not():
    """torch's DDP reducer stages its record of used parameters in pinned host memory for a
    PrivateUse1 device and asserts it got some; torchvulkan pins nothing. The program hears
    why when it wraps the model (not torch's internal assert in backward), and the way out
    runs. The test accelerator pins, and both train."""
    for target in targets():
        result = python("-m", "cudashim", *target.options, "-c", UNUSED_PARAMETERS, env={"PORT": str(free_port())})
        assert result.returncode == 0, result.stderr[-4000:]
        first, second = result.stdout.strip().splitlines()[-2:]
        if target.pins_memory:                  # the gradient accumulates over both runs
            assert (first, second) == ("trained 8.0", "trained 16.0")
        else:
            assert second == "trained 8.0"
            assert first.startswith(f"UnsupportedCudaAPI DistributedDataParallel(find_unused_parameters=True) is "
                                    f"not supported by cudashim on the '{target.name}' backend: torch's DDP stages")
            assert "find_unused_parameters=False runs" in first


def test_eager_init_with_a_cuda_device_id_and_a_mesh_from_the_group():
    """init_process_group("nccl", device_id=cuda_device) and DeviceMesh.from_group: on the
    collectives cudashim stages through host memory its group connects no device eagerly;
    on the test accelerator's own library the device is bound."""
    for target in targets():
        result = torchrun("tests/programs/eager_init.py", nproc=1, shim_options=target.options, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        module = "torchvulkan" if target is VULKAN else "cudashim.testdevice.module"
        dtype = "torch.bfloat16" if target.bf16 else "torch.float16"     # the vendor's own module's answer
        assert f"rank 0: bound nccl, {module}, True, {dtype}" in result.stdout


def test_spawned_ranks_take_one_device_each(tmp_path):
    """mp.spawn, one rank per CUDA device: vulkan's one device shared by two CUDA devices,
    the test accelerator's two."""
    for target in targets():
        out = tmp_path / target.name
        _run("--device-count", "2", "tests/programs/spawned_ranks.py", str(out), target=target)
        ranks = [json.loads(out.with_name(f"{target.name}.rank{rank}.json").read_text()) for rank in (0, 1)]
        assert [rank["current"] for rank in ranks] == [0, 1]
        assert [rank["device"] for rank in ranks] == [target.device(0), target.device(1)]
        for rank in ranks:
            assert rank == {**rank, "sum": [3.0, 3.0, 3.0], "is_cuda": True, "backend": "nccl"}


@pytest.mark.torch_range
def test_transformers_generates_the_same_tokens_as_on_the_cpu(tmp_path):
    pytest.importorskip("transformers")

    def tokens(target):
        run = _run("tests/programs/hf_generate.py", str(tmp_path / (target.name if target else "cpu")), target=target)
        return json.loads(run.stdout.strip().splitlines()[-1])

    on_cpu = tokens(None)
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        on_target = tokens(target)
        assert on_target == on_cpu, target.name
        assert on_target["sdpa"] == on_target["flash_attention_2"] == on_target["device_map"]


def test_the_cuda_libraries_example_trains_with_the_stand_ins(tmp_path):
    """flash_attn, apex and pynvml stand-ins on device tensors. The example draws its batches
    on the device, whose generator is not the host's, so its losses are compared in shape."""
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        losses_at = tmp_path / f"{target.name}.json"
        run = _run("--report", "examples/cuda_libraries.py", "--steps", "20", "--losses", str(losses_at),
                   target=target)
        losses = json.loads(losses_at.read_text())
        assert len(losses) == 20 and losses[-1] < losses[0] / 2
        assert "GPU memory used" in run.stdout
        for library in ("flash_attn", "apex"):
            assert f"{library}: the real package is not installed" in run.stderr
        # torch imported the installed nvidia-ml-py before cudashim activated: replaced then
        assert f"pynvml: the real package, imported before activation, it fails on {target.name}" in run.stderr


def test_qlora_trains_and_generates_as_on_the_cpu(tmp_path):
    """transformers loads the model quantized by bitsandbytes onto the device (through torch's
    private _parse_to), PEFT trains LoRA adapters there and it generates: the same losses and
    tokens as on the CPU backend. bitsandbytes says once that its 8-bit optimizers have no
    kernel on the device; the program uses none. 8-bit here; 4-bit (nf4) runs the same way, on
    bitsandbytes' kernels in torch operations, at several times the cost on llvmpipe."""
    for package in ("bitsandbytes", "peft", "transformers"):
        pytest.importorskip(package)

    def qlora(target):
        run = _run("tests/programs/qlora.py", str(tmp_path / (target.name if target else "cpu")), "--bits", "8",
                   "--steps", "3", "--new-tokens", "3", target=target)
        said = [line for line in run.stderr.splitlines() if "has no kernel on" in line]
        assert len(said) == (1 if target else 0) and (not said or "8-bit optimizers" in said[0])
        return json.loads(run.stdout.strip().splitlines()[-1])

    on_cpu = qlora(None)            # the CPU backend: its 8-bit run (test_substitutes runs 4-bit)
    assert on_cpu["weight_dtype"] == "torch.int8" and on_cpu["is_cuda"] and on_cpu["adapters_moved"]
    assert on_cpu["device"] == "cpu" and len(on_cpu["tokens"]) == 4 + 3          # prompt and new tokens
    assert all(math.isfinite(x) for x in on_cpu["losses"]) and on_cpu["losses"][-1] < on_cpu["losses"][0]
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        seen = qlora(target)
        assert seen["device"] == target.device(0) and seen["adapters_moved"]
        assert seen["weight_dtype"] == on_cpu["weight_dtype"]
        assert seen["losses"] == pytest.approx(on_cpu["losses"], rel=1e-4), target.name
        assert seen["tokens"] == on_cpu["tokens"]


def test_recurrent_models_train_as_on_the_cpu(tmp_path):
    """nn.LSTM, nn.GRU and their cells call fused cell ops that only CUDA implements on
    every accelerator; the host has no kernel for them either, so an extension's own host
    fallback cannot run them. cudashim's portable kernels compute them on the device."""
    def losses(target):
        name = target.name if target else "cpu"
        run = _run("--report", "tests/programs/recurrent.py", str(tmp_path / f"{name}.json"), target=target)
        filled = [line for line in run.stderr.splitlines() if "cudashim's portable kernel" in line]
        assert len(filled) == (4 if target else 0), run.stderr[-3000:]
        return json.loads((tmp_path / f"{name}.json").read_text())

    on_cpu = losses(None)
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        on_target = losses(target)
        assert on_target.keys() == {"LSTM", "GRU", "LSTMCell", "GRUCell"}
        for model, expected in on_cpu.items():
            assert on_target[model] == pytest.approx(expected, rel=1e-5), (target.name, model)
            assert on_target[model][-1] < on_target[model][0]
        doctor = _doctor("--kernels", *target.options)
        assert "aten::_thnn_fused_lstm_cell, aten::_thnn_fused_lstm_cell_backward_impl" in doctor
        assert "extension's own fallback runs them on the host" in doctor


@pytest.mark.torch_range
def test_sparse_and_nested_tensors_where_the_target_has_no_kernels_for_them(tmp_path):
    """Neither target has sparse or nested kernels; without cudashim a sparse tensor dies at its
    first ``.cuda()`` and a padded batch in the encoder's first layer (tests/programs/layouts.py).
    - A GCN's sparse adjacency moved with ``.cuda()`` and multiplied in every layer, saved and
      loaded back, and ``nn.Embedding(sparse=True)`` stepped by SparseAdam: held on the host
      behind device tensors, as the CPU computes them. (torchvulkan's own embedding kernel
      refuses ``sparse=True``: the embeddings run on the test accelerator only.)
    - The same GCN over a CSR adjacency, a weight made BSR and CSC on the device, an in-place
      scale, a checkpoint: their parts on the device, their ops computed on the host.
    - Quantization-aware training of a convnet (fake quantization, dense ops) converted to int8
      on the host: the same losses.
    - ``nn.TransformerEncoder`` over padded batches in inference, which torch computes on a
      nested tensor: the same outputs, padded positions zero as the nested path leaves them."""
    import torch

    def seen(target):
        name = target.name if target else "cpu"
        embeddings = () if target is VULKAN else ("--embeddings",)
        run = _run("--report", "tests/programs/layouts.py", str(tmp_path / f"{name}.json"),
                   *embeddings, target=target)
        said = [line for line in run.stderr.splitlines() if "are held in host memory" in line]
        counted = [line for line in run.stderr.splitlines() if "run on the host (torch.sparse_coo" in line]
        assert len(said) == (1 if target else 0) and bool(counted) == bool(target), run.stderr[-3000:]
        said_compressed = [line for line in run.stderr.splitlines()
                           if "has no kernels for sparse compressed tensors" in line]
        assert len(said_compressed) == (1 if target else 0), run.stderr[-3000:]
        counted_compressed = [line for line in run.stderr.splitlines()
                              if line.startswith("aten::mm on torch.sparse_csr ")]
        assert bool(counted_compressed) == bool(target), run.stderr[-3000:]
        padded = "its layers on the padded batch" in run.stderr
        assert padded == bool(target), run.stderr[-3000:]
        if target:
            assert "torch.sparse_coo tensors on" in said[0] and "aten::" in said[0]
            assert any(line.startswith("aten::mm ") for line in counted)
        return json.loads((tmp_path / f"{name}.json").read_text())

    on_cpu = seen(None)
    assert on_cpu["rows_changed"] == on_cpu["rows_used"]
    assert on_cpu["csr_losses"][-1] < on_cpu["csr_losses"][0]
    assert on_cpu["bsr_linear"] == [[pytest.approx(v, rel=1e-4, abs=1e-5) for v in row] for row in on_cpu["dense_linear"]]
    assert on_cpu["scaled"][0] == pytest.approx(2 * on_cpu["scaled"][1], rel=1e-5)
    for target in targets():
        on_target = seen(target)
        assert on_target["adj_device"] == target.device(0) and on_target["adj_is_cuda"]
        assert on_target["adj_layout"] == "torch.sparse_coo" and on_target["adj_nnz"] == on_cpu["adj_nnz"]
        assert on_target["gcn_losses"] == pytest.approx(on_cpu["gcn_losses"], rel=1e-5), target.name
        assert on_target["gcn_losses"][-1] < on_target["gcn_losses"][0]
        assert on_target["rows_summed"] == pytest.approx(on_cpu["rows_summed"], rel=1e-6)
        assert on_target["reloaded_adj"] == [target.device(0), "torch.sparse_coo", True]
        assert on_target["host_copy"] == ["cpu", "torch.sparse_coo"]
        if target is not VULKAN:
            assert on_target["grad"] == ["torch.sparse_coo", target.device(0)]
            assert on_target["embedding_losses"] == pytest.approx(on_cpu["embedding_losses"], rel=1e-5)
            assert on_target["rows_changed"] == on_target["rows_used"] == on_cpu["rows_used"]
        device = target.device(0)
        assert on_target["csr"] == [device, "torch.sparse_csr", device, on_cpu["csr"][3]]
        assert on_target["csr_losses"] == pytest.approx(on_cpu["csr_losses"], rel=1e-5), target.name
        assert on_target["bsr"] == [device, "torch.sparse_bsr", device, on_cpu["bsr"][3]]
        assert on_target["bsr_linear"] == [[pytest.approx(v, rel=1e-4, abs=1e-5) for v in row]
                                           for row in on_cpu["bsr_linear"]]
        assert on_target["csc"] == [device, "torch.sparse_csc", True]
        assert on_target["scaled"][:2] == pytest.approx(on_cpu["scaled"][:2], rel=1e-5)
        assert on_target["scaled"][2] == device
        assert on_target["reloaded_csr"] == [device, "torch.sparse_csr", True]
        assert on_target["host_csr"] == ["cpu", "torch.sparse_csr", True]
        # saved as CUDA saves a CSR tensor: this process, without cudashim, loads it to the host
        saved = torch.load(tmp_path / f"{target.name}.json.csr.pt", map_location="cpu", weights_only=False)["adj"]
        assert saved.layout is torch.sparse_csr and saved.device.type == "cpu"
        assert torch.equal(saved.to_dense(), torch.load(tmp_path / "cpu.json.csr.pt")["adj"].to_dense())
        assert on_target["qat_losses"] == pytest.approx(on_cpu["qat_losses"], rel=1e-4), target.name
        assert on_target["qat_int8"] == [pytest.approx(row, abs=0.2) for row in on_cpu["qat_int8"]]
        assert on_target["encoded_device"] == target.device(0)
        for row, expected in zip(on_target["encoded"], on_cpu["encoded"]):
            assert row == [pytest.approx(position, abs=1e-5) for position in expected], target.name
        assert on_target["pooled"] == [pytest.approx(p, abs=1e-5) for p in on_cpu["pooled"]]
        doctor = _doctor("--kernels", *target.options)
        assert "COO tensors are held in host memory" in doctor, doctor[:2000]
        assert "compressed ones keep their index and value tensors on" in doctor, doctor[:2000]


def test_sync_batch_norm_on_two_ranks_normalizes_with_the_whole_batch(tmp_path):
    """SyncBatchNorm's statistics ops are CUDA-only (cudashim's portable kernels on the
    device), and it gathers them into a (1, world * n) tensor as NCCL allows: each rank's
    share normalizes, back-propagates and updates running statistics as plain BatchNorm over
    the whole batch does (the same program on the CPU backend: tests/test_multiprocess.py)."""
    for target in targets():
        out = tmp_path / target.name
        result = torchrun("tests/programs/sync_batchnorm.py", str(out), shim_options=target.options, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
        for rank in (0, 1):
            seen = json.loads(out.with_name(f"{target.name}.rank{rank}.json").read_text())
            assert seen["device"] == target.device(rank)
            assert all(worst < 1e-5 for worst in seen["worst"].values()), (target.name, seen)


def test_data_parallel_and_model_parallel_on_two_cuda_devices(tmp_path):
    """nn.DataParallel, data_parallel, nn.parallel by hand and torch.cuda.comm over cuda:0 and
    cuda:1, the test accelerator's two devices: replicas get copies in device memory, host
    inputs are scattered onto the device, gathers to "cpu" reach the host (the checks:
    test_data_parallel.py). The tutorials' model-parallel halves and a DCGAN with --ngpu 2
    train as on the CPU backend."""
    from test_data_parallel import TWO, check_semantics, semantics

    (tmp_path / "cpu").mkdir()
    on_cpu = semantics(tmp_path / "cpu", TWO)
    _run(*TWO, "tests/programs/dcgan_data_parallel.py", str(tmp_path / "dcgan-cpu.json"), "--ngpu", "2")
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        (tmp_path / target.name).mkdir()
        seen = semantics(tmp_path / target.name, target.options + TWO)
        check_semantics(seen)
        assert seen["reduce_add_host_input"] == "AssertionError"   # as CUDA: inputs on GPUs
        assert seen["loss"] == pytest.approx(on_cpu["loss"], rel=1e-5)

        parallel_at = tmp_path / f"mp-{target.name}.json"
        _run(*TWO, "tests/programs/model_parallel_tutorial.py", str(parallel_at), target=target)
        parallel = json.loads(parallel_at.read_text())
        halves = [target.device(0), target.device(1)]
        assert parallel["parts_on"] == halves and parallel["toy_output_on"] == target.device(1)
        assert parallel["pipeline"] == pytest.approx(parallel["single"], rel=1e-5)
        assert parallel["model_parallel"] == pytest.approx(parallel["single"], rel=1e-5)

        losses = {}
        _run(*TWO, "tests/programs/dcgan_data_parallel.py", str(tmp_path / f"dcgan-{target.name}.json"),
             "--ngpu", "2", target=target)
        for name in ("cpu", target.name):
            steps = json.loads((tmp_path / f"dcgan-{name}.json").read_text())["losses"]
            losses[name] = [loss for step in steps for loss in step]      # (D, G) per step
        assert losses[target.name] == pytest.approx(losses["cpu"], rel=1e-4)


def test_the_test_accelerator_is_a_device_of_its_own():
    """Loaded into this forked test process without cudashim: what torch sees of it."""
    targets(where=lambda target: target is SHIMDEV)
    import torch
    import torch.distributed as dist
    from cudashim import testdevice
    testdevice.load(2)

    assert torch.accelerator.current_accelerator().type == "shimdev" and torch.accelerator.device_count() == 2
    before = torch.accelerator.memory_allocated(1)
    x = torch.arange(1024, dtype=torch.float32, device="shimdev:1")
    assert torch.accelerator.memory_allocated(1) >= before + x.nbytes and not torch.shimdev.host_readable(x)
    assert x.sum().item() == sum(range(1024)) and x.cpu().tolist() == list(range(1024))
    x.resize_(2048)                                     # grown in device memory, content kept
    assert x[:1024].cpu().tolist() == list(range(1024)) and x.device == torch.device("shimdev", 1)
    del x
    assert torch.accelerator.memory_allocated(1) == before
    # freed memory is kept for the next allocation of its size, as CUDA's caching allocator
    # keeps it, until empty_cache() gives it back
    reserved = torch.shimdev.memory_reserved(1)
    assert reserved > torch.accelerator.memory_allocated(1)
    y = torch.empty(2048, device="shimdev:1")
    assert torch.shimdev.memory_reserved(1) == reserved
    del y
    torch.shimdev.empty_cache()
    assert torch.shimdev.memory_reserved(1) == torch.accelerator.memory_allocated(1) == before

    # One generator per device: the same seed draws the same numbers, devices do not share.
    torch.shimdev.manual_seed_all(5)
    first = [torch.randn(3, device=f"shimdev:{i}").cpu() for i in (0, 1)]
    assert torch.equal(first[0], first[1])
    again = torch.randn(3, device="shimdev:0").cpu()
    assert not torch.equal(again, first[0])
    generator = torch.Generator(device="shimdev:1").manual_seed(5)
    assert generator.device == torch.device("shimdev", 1)
    assert torch.equal(torch.randn(3, device="shimdev:1", generator=generator).cpu(), first[1])

    stream = torch.Stream(device="shimdev:1")
    start, end = torch.Event(device="shimdev:1", enable_timing=True), torch.Event(device="shimdev:1", enable_timing=True)
    with stream:
        start.record()
        end.record()
    end.synchronize()
    assert stream.device == torch.device("shimdev", 1) and start.elapsed_time(end) >= 0

    pinned = torch.ones(4).pin_memory()
    assert pinned.is_pinned() and not torch.ones(4).is_pinned()
    assert pinned.to("shimdev", non_blocking=True).sum().item() == 4
    with torch.autocast("shimdev", dtype=torch.float16):
        assert (torch.ones(2, 2, device="shimdev") @ torch.ones(2, 2, device="shimdev")).dtype == torch.float16
    weight = torch.nn.Parameter(torch.ones(2, device="shimdev"))
    weight.data = torch.zeros(2)                        # between device and host, as with CUDA
    assert weight.device.type == "cpu"

    assert dist.Backend.default_device_backend_map["shimdev"] == "shimccl"
    with pytest.raises(RuntimeError, match="cannot change to 3"):
        testdevice.load(3)


def test_the_backend_contract_holds_on_the_test_accelerator():
    targets(where=lambda target: target is SHIMDEV)
    from test_backends import check_contract
    from cudashim import backends, testdevice
    from cudashim._settings import load
    testdevice.load(2)
    cls, reason = backends.resolve("auto")
    assert cls.name == "accelerator" and "detected" in reason
    check_contract(cls(load()), "shimdev")


def test_the_test_accelerator_says_what_it_needs_where_it_cannot_be_built(monkeypatch, tmp_path):
    """Where no build of it exists yet (a build made before loads without a compiler)."""
    from cudashim import testdevice
    from cudashim.errors import BackendUnavailableError
    monkeypatch.setenv("CXX", "no-such-compiler")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(testdevice, "_compiled", None)
    with pytest.raises(BackendUnavailableError, match=r"^the test accelerator cannot be built: no C\+\+ compiler "
                                                      r"\('no-such-compiler' is not on PATH; install g\+\+ or set CXX\)$"):
        testdevice.load(2)


COMPILED = """
import warnings, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 1)).cuda()
x = torch.randn(3, 4).cuda()
eager = model(x)
eager.sum().backward()
grad = model[0].weight.grad.clone()
model.zero_grad()
with warnings.catch_warnings(record=True) as said:
    warnings.simplefilter("always")
    compiled = torch.compile(model)(x)
    compiled.sum().backward()
print(torch.equal(compiled, eager), torch.equal(model[0].weight.grad, grad), compiled.device,
      "|".join(str(w.message).split(";")[0] for w in said if "inductor" in str(w.message)))
"""


def test_torch_compile_runs_where_inductor_has_no_code_generator_for_the_device():
    """torch.compile's default (inductor) has no code generator for the test accelerator (nor
    torchvulkan, nor a vendor that registers none): its graphs compile with AOTAutograd's
    eager backend, forward and backward equal to eager, and the program is told once."""
    for target in targets(**ON_THE_TEST_ACCELERATOR):
        # one compile thread: no pool of compile workers that aot_eager would not use
        result = python("-m", "cudashim", *target.options, "-c", COMPILED, env={"TORCHINDUCTOR_COMPILE_THREADS": "1"})
        assert result.returncode == 0, result.stderr[-4000:]
        assert result.stdout.strip().splitlines()[-1] == (
            f"True True {target.device(0)} torch.compile: inductor has no code generator for the "
            f"'{target.name}' device")
