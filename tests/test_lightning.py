"""Real Lightning programs written for GPUs, run unmodified under ``python -m cudashim``.

Lightning is not in the suite's environment; tox's ``frameworks`` environment installs a
pinned release and runs this file. The program is ``tests/programs/lightning_train.py``: a
Trainer (fit, checkpoint, resume, test) or a Fabric loop (setup, save, load).
"""

import json
import sys
from pathlib import Path

import pytest

from conftest import ROOT, host_profile, python

pytest.importorskip("lightning")

PROGRAM = str(ROOT / "tests" / "programs" / "lightning_train.py")


def _run(tmp_path, *options, shim=("-m", "cudashim"), env=()):
    return _run_and_print(tmp_path, *options, shim=shim, env=env)[0]


def _run_and_print(tmp_path, *options, shim=("-m", "cudashim"), env=()):
    """What rank 0 saw, and what the run printed."""
    out = tmp_path / "out.json"
    result = python(*shim, PROGRAM, *options, "--checkpoint", str(tmp_path / "checkpoints"),
                    "--out", str(out), env={"CUDASHIM_DEVICE_COUNT": "2", **dict(env)}, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text()), result.stdout + result.stderr


def _check(seen, world_size):
    # Lightning's CUDA accelerator ran, holding CUDA devices; the tensors are on the target
    assert seen["accelerator"] == "CUDAAccelerator" and seen["world_size"] == world_size
    assert seen["root_device"] == f"cuda:{0}"
    assert seen["parameter"] == ["cpu", True]
    assert all(loss == loss and loss < 10 for loss in seen["losses"])       # finite, trained
    # resumed from the checkpoint, the same steps give the same losses
    assert seen["resumed"] == seen["continued"] and len(seen["continued"]) > 0


@pytest.mark.parametrize("loop", ["trainer", "fabric"])
def test_one_gpu_equals_lightnings_cpu_accelerator(tmp_path, loop):
    """accelerator="gpu" under the shim and accelerator="cpu" without it train the Trainer's
    model bit for bit alike; Fabric's loop, the program's own, trains and resumes."""
    (tmp_path / "shim").mkdir()
    (tmp_path / "native").mkdir()
    shimmed = _run(tmp_path / "shim", "--loop", loop, "--accelerator", "gpu" if loop == "trainer" else "cuda")
    _check(shimmed, world_size=1)
    if loop == "fabric":                    # Fabric's loop is the program's own: the Trainer's proves it
        return
    native = _run(tmp_path / "native", "--loop", loop, "--accelerator", "cpu", shim=())
    assert native["accelerator"] == "CPUAccelerator"
    assert shimmed["losses"] == native["losses"] and shimmed["resumed"] == native["resumed"]
    # the batches Lightning moved for training_step are on the target and answer is_cuda
    assert shimmed["step"] == {"device": "cpu", "batch_is_cuda": True}
    assert shimmed["test_loss"] == native["test_loss"]


@pytest.mark.parametrize("loop, precision", [("trainer", "16-mixed"), ("fabric", "bf16-mixed")])
def test_ddp_on_two_gpus(tmp_path, loop, precision):
    """Two ranks launched by Lightning itself (it runs the script again for rank 1), DDP over
    the program's NCCL, mixed precision as GPU programs ask for it."""
    seen = _run(tmp_path, "--loop", loop, "--accelerator", "gpu", "--devices", "2", "--strategy", "ddp",
                "--precision", precision)
    _check(seen, world_size=2)
    assert seen["strategy"] == "DDPStrategy" and seen["backend"] == "nccl"
    # CUDA's AMP, as on a GPU machine; the target's precision policy decides what it computes in
    assert seen["precision"] == ["MixedPrecision", "cuda"]


def test_ddp_on_two_gpus_sharing_one_vulkan_device(tmp_path):
    """The same DDP run on torchvulkan, whose memory is the device's own: Lightning's batches
    and model reach the device, its process group (which Lightning binds to a device) is the
    collectives cudashim stages through host memory, and the resumed run repeats the continued
    one. Lightning moves the model back to the host when the Trainer is done. (On cudashim's
    test accelerator it runs the same way; the suite leaves that run out for time.)"""
    from targets import VULKAN, targets
    for target in targets(where=lambda target: target is VULKAN):
        (tmp_path / target.name).mkdir()
        seen = _run(tmp_path / target.name, "--devices", "2", "--strategy", "ddp", "--precision", "16-mixed",
                    shim=("-m", "cudashim", *target.options, "--device-count", "2"))
        assert seen["accelerator"] == "CUDAAccelerator" and seen["world_size"] == 2 and seen["backend"] == "nccl"
        assert seen["step"] == {"device": target.device(0), "batch_is_cuda": True}
        assert seen["parameter"] == ["cpu", False]
        assert seen["resumed"] == seen["continued"] and seen["same_weights"] and seen["trained"]


def test_fsdp_on_two_gpus_shards_resumes_and_tests(tmp_path):
    """strategy="fsdp" in 16-mixed on devices "0,1" (Lightning's list of GPU indices): FSDP
    over the program's NCCL, each rank holding a shard, resumed exactly from Lightning's
    checkpoint and tested from it. Lightning's advice to set a float32 matmul precision
    appears only where that setting changes what the target computes."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import PrecisionPolicy

    seen, printed = _run_and_print(tmp_path, "--devices", "0,1", "--strategy", "fsdp", "--precision", "16-mixed")
    _check(seen, world_size=2)
    assert seen["strategy"] == "FSDPStrategy" and seen["backend"] == "nccl"
    assert seen["same_weights"] and seen["trained"] and seen["test_loss"] < 10
    reduced_matmul = PrecisionPolicy("auto", "auto", "cpu", *cpu_speed.speeds(host_profile())).float32_matmul_precision
    assert ("has Tensor Cores" in printed) == (reduced_matmul is not None)


def test_ddp_spawn_ranks_train_their_own_copies_as_lightnings_cpu_accelerator_does(tmp_path):
    """ddp_spawn sends the model through mp.spawn, in shared memory: each rank must train its
    own copy (on a GPU its .to() makes one), not one set of weights that both ranks step."""
    out = tmp_path / "out.json"
    result = python("-m", "cudashim", PROGRAM, "--devices", "2", "--strategy", "ddp_spawn", "--once",
                    "--checkpoint", str(tmp_path / "checkpoints"), "--out", str(out),
                    env={"CUDASHIM_DEVICE_COUNT": "2"}, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank} trained weights in shared memory: False" in result.stdout
    seen = json.loads(out.read_text())
    assert seen["accelerator"] == "CUDAAccelerator" and seen["root_device"] == "cuda:0"
    assert seen["world_size"] == 2 and seen["trained"]


def test_the_accelerators_hold_cuda_devices_while_active_and_get_their_own_back():
    """Lightning imported before activation: both CUDA accelerators hold real CUDA devices
    (which every tensor API translates) while cudashim is active, and their own method after."""
    import torch
    import cudashim
    from lightning.fabric.accelerators.cuda import CUDAAccelerator as FabricCUDA
    from lightning.pytorch.accelerators.cuda import CUDAAccelerator
    originals = {cls: vars(cls)["get_parallel_devices"] for cls in (FabricCUDA, CUDAAccelerator)}
    cudashim.activate("cpu", device_count=2)
    try:
        for cls in originals:
            assert cls.get_parallel_devices([0, 1]) == [torch._C.device("cuda", 0), torch._C.device("cuda", 1)]
            assert torch.device("cuda", 1).type == "cpu"        # what Lightning's own code would get
        assert torch.zeros(1, device=CUDAAccelerator.get_parallel_devices([1])[0]).is_cuda
    finally:
        cudashim.deactivate()
    for cls, original in originals.items():
        assert vars(cls)["get_parallel_devices"] is original


FABRIC_SCRIPT = '''
import torch
import lightning as L

fabric = L.Fabric()                 # fabric run passes the accelerator, devices and strategy
model = torch.nn.Linear(4, 1)
model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
fabric.backward(model(torch.ones(8, 4, device=fabric.device)).pow(2).mean())
optimizer.step()
print(f"rank {fabric.global_rank}/{fabric.world_size}: {type(fabric.accelerator).__name__} {fabric.device} "
      f"{type(fabric.strategy).__name__}", flush=True)
'''


def test_fabric_run_launches_two_cuda_ranks(tmp_path):
    """``fabric run --accelerator cuda --devices 2 script.py``: Lightning's own launcher."""
    script = tmp_path / "script.py"
    script.write_text(FABRIC_SCRIPT)
    fabric = Path(sys.executable).parent / "fabric"             # the console script users type
    result = python("-m", "cudashim", str(fabric), "run", "--accelerator", "cuda", "--devices", "2", str(script),
                    env={"CUDASHIM_DEVICE_COUNT": "2"}, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}/2: CUDAAccelerator cuda:{rank} DDPStrategy" in result.stdout


MONITORED = '''
import sys
import torch
import lightning as L
from lightning.pytorch.callbacks import DeviceStatsMonitor
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        return self.layer(batch[0]).pow(2).mean()

    def predict_step(self, batch, batch_idx):
        return self.layer(batch[0])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    data = DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8)
    trainer = L.Trainer(accelerator="gpu", devices=-1, max_steps=2, logger=CSVLogger(sys.argv[1]),
                        log_every_n_steps=1, callbacks=[DeviceStatsMonitor()], enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    model = Model()
    trainer.fit(model, data)
    predictions = trainer.predict(model, data)
    if trainer.global_rank == 0:
        print(f"devices {trainer.num_devices}, {len(predictions)} predictions", flush=True)
'''


def test_every_gpu_device_stats_and_predict(tmp_path):
    """devices=-1 takes every CUDA device the program sees; DeviceStatsMonitor logs CUDA's
    memory statistics; predict runs on the two ranks."""
    script = tmp_path / "monitored.py"
    script.write_text(MONITORED)
    result = python("-m", "cudashim", str(script), str(tmp_path / "logs"), env={"CUDASHIM_DEVICE_COUNT": "2"},
                    timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "devices 2, 2 predictions" in result.stdout
    header = next((tmp_path / "logs").rglob("metrics.csv")).read_text().splitlines()[0]
    assert "DeviceStatsMonitor.on_train_batch_end/allocated_bytes.all.current" in header


def test_the_deepspeed_strategy_on_deepspeeds_accelerator_for_the_target(tmp_path):
    """strategy="deepspeed": Lightning's CUDA accelerator around DeepSpeed's own CPU one,
    fp16 with DeepSpeed's loss scaling, its checkpoints saved and resumed exactly."""
    pytest.importorskip("deepspeed")
    seen = _run(tmp_path, "--devices", "2", "--strategy", "deepspeed", "--precision", "16-mixed")
    _check(seen, world_size=2)
    assert seen["strategy"] == "DeepSpeedStrategy" and seen["same_weights"] and seen["trained"]


CLI_SCRIPT = '''
import torch
import lightning as L
from lightning.pytorch.cli import LightningCLI
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, width: int = 8):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(4, width), torch.nn.Linear(width, 1))

    def training_step(self, batch, batch_idx):
        return self.body(batch[0]).pow(2).mean()

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(32, 4)), batch_size=8)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def on_train_end(self):
        print(f"rank {self.global_rank}: {type(self.trainer.accelerator).__name__} "
              f"{self.trainer.strategy.root_device} {self.trainer.precision}", flush=True)


if __name__ == "__main__":
    LightningCLI(Model)
'''


def test_lightning_cli_with_the_gpu_accelerator(tmp_path):
    pytest.importorskip("jsonargparse")
    script = tmp_path / "cli.py"
    script.write_text(CLI_SCRIPT)
    result = python("-m", "cudashim", str(script), "fit", "--trainer.accelerator", "gpu", "--trainer.devices", "2",
                    "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "1", "--trainer.logger", "false",
                    "--trainer.enable_checkpointing", "false", env={"CUDASHIM_DEVICE_COUNT": "2"}, timeout=300,
                    cwd=tmp_path)                      # where the CLI writes its config.yaml
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: CUDAAccelerator cuda:{rank} bf16-mixed" in result.stdout
