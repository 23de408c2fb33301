"""The frameworks group: DeepSpeed is told which of its accelerators matches the target.

These need no DeepSpeed; tests/test_deepspeed.py runs real DeepSpeed programs."""

import os
import sys
import types
import warnings

import numpy as np
import pytest
import torch  # noqa: F401  (activation patches once torch is imported)

import cudashim
from cudashim.backends import backend_class
from cudashim.errors import CudashimWarning


@pytest.mark.parametrize("name, expected", [("cpu", "cpu"), ("xpu", "xpu"), ("npu", "npu"),
                                            ("hpu", "hpu"), ("mps", "mps"), ("cuda", None)])
def test_each_backend_names_the_matching_deepspeed_accelerator(name, expected):
    assert backend_class(name).deepspeed_accelerator == expected


def test_activation_names_the_target_accelerator_and_deactivation_takes_it_back(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    cudashim.activate("cpu")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    cudashim.deactivate()
    assert "DS_ACCELERATOR" not in os.environ


def test_the_users_own_choice_is_kept(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with cudashim.activated("cpu"):
        assert os.environ["DS_ACCELERATOR"] == "cuda"
    assert os.environ["DS_ACCELERATOR"] == "cuda"


def test_with_the_group_off_deepspeed_is_not_told(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    with cudashim.activated("cpu", disable=["frameworks"]):
        assert "DS_ACCELERATOR" not in os.environ


def _fake_deepspeed(monkeypatch, chosen_name):
    """DeepSpeed's two modules the group hooks, already imported (with a chosen accelerator)."""
    chosen = types.SimpleNamespace(_name=chosen_name)
    real_accelerator = types.ModuleType("deepspeed.accelerator.real_accelerator")
    real_accelerator.ds_accelerator = chosen
    cpu_accelerator = types.ModuleType("deepspeed.accelerator.cpu_accelerator")

    class NotImplementedBuilder:
        pass

    class CPU_Accelerator:
        def is_fp16_supported(self):
            return False

        def get_op_builder(self, class_name):
            return NotImplementedBuilder if class_name != "CPUAdamBuilder" else "its own builder"

    cpu_accelerator.CPU_Accelerator = CPU_Accelerator
    monkeypatch.setitem(sys.modules, real_accelerator.__name__, real_accelerator)
    monkeypatch.setitem(sys.modules, cpu_accelerator.__name__, cpu_accelerator)
    return CPU_Accelerator


def test_deepspeed_that_chose_cuda_before_activation_is_warned_about(monkeypatch):
    _fake_deepspeed(monkeypatch, "cuda")
    with pytest.warns(CudashimWarning, match="DeepSpeed chose its 'cuda' accelerator before"):
        cudashim.activate("cpu")
    cudashim.deactivate()


def test_deepspeed_that_chose_the_matching_one_is_not_warned_about(monkeypatch):
    _fake_deepspeed(monkeypatch, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudashimWarning)
        cudashim.activate("cpu")
    cudashim.deactivate()


def test_the_cpu_accelerator_answers_fp16_while_active(monkeypatch):
    accelerator = _fake_deepspeed(monkeypatch, "cpu")
    with cudashim.activated("cpu"):
        assert accelerator().is_fp16_supported() is True
    assert accelerator().is_fp16_supported() is False


# --- the 1-bit optimizers' backends -------------------------------------------------------
def test_the_cpu_accelerator_gets_a_packbits_op_while_active(monkeypatch):
    accelerator = _fake_deepspeed(monkeypatch, "cpu")
    with cudashim.activated("cpu"):
        builder = accelerator().get_op_builder("PackbitsBuilder")
        assert builder.__module__ == "cudashim.patches.frameworks.deepspeed_onebit"
        assert accelerator().get_op_builder("CPUAdamBuilder") == "its own builder"
        packer = builder().load()
        values = torch.tensor([0.5, -1.0, 0.0, -0.0, 2.0, -3.0, 1e-30, -1e-30, 4.0, -5.0])
        packed = packer.packbits(values, 9, 0)          # the first nine; the tenth is left out
        # zero counts as positive (DeepSpeed's NCCL backend packs sign(x) + 1 != 0)
        expected = np.packbits((values[:9] >= 0).numpy())
        assert packed.dtype == torch.uint8 and packed.numpy().tolist() == expected.tolist()
        unpacked = packer.unpackbits(packed, packed.numel(), 0)
        assert unpacked.tolist()[:9] == [1.0, -1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]
        assert unpacked.dtype == torch.float32 and unpacked.numel() == 16
    assert accelerator().get_op_builder("PackbitsBuilder").__name__ == "NotImplementedBuilder"


def _fake_nccl_backend(tmp_path, monkeypatch):
    """DeepSpeed's package path down to its NCCL 1-bit backend, which imports CuPy."""
    comm = tmp_path / "deepspeed" / "runtime" / "comm"
    comm.mkdir(parents=True)
    for package in (comm.parent.parent, comm.parent, comm):
        (package / "__init__.py").write_text("")
    (comm / "nccl.py").write_text("import cupy\n\nclass NcclBackend:\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "deepspeed" or m.startswith("deepspeed.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "cupy", None)          # not installed


def test_the_nccl_one_bit_backend_is_served_while_active_and_real_again_after(tmp_path, monkeypatch):
    _fake_nccl_backend(tmp_path, monkeypatch)
    with cudashim.activated("cpu"):
        from deepspeed.runtime.comm.nccl import NcclBackend
        assert NcclBackend.__module__ == "cudashim.patches.frameworks.deepspeed_onebit"
    with pytest.raises(ImportError, match="cupy"):
        from deepspeed.runtime.comm.nccl import NcclBackend  # noqa: F811


@pytest.fixture
def world_of_one(shim, tmp_path):
    yield f"file://{tmp_path}/store"
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_the_served_nccl_backend_keeps_deepspeeds_call(world_of_one):
    """One rank: the average of one buffer is itself, compressed to its scale times its
    signs; the result comes back in the buffer's shape, the errors hold what was lost."""
    from cudashim.kernels import error_buffer_size
    from cudashim.patches.frameworks.deepspeed_onebit import NcclBackend

    torch.distributed.init_process_group("nccl", init_method=world_of_one, rank=0, world_size=1)
    backend = NcclBackend()
    assert (backend.rank, backend.size) == (0, 1)
    buffer = torch.randn(3, 5, device="cuda")
    original = buffer.clone()
    worker_error = torch.zeros(error_buffer_size(buffer.numel(), 1), device="cuda")
    server_error = torch.zeros(worker_error.numel(), device="cuda")
    result = backend.compressed_allreduce(buffer, worker_error, server_error, 0)
    assert result.shape == (3, 5) and result.is_cuda
    scale = original.norm() / worker_error.numel() ** 0.5      # over the padded length, as DeepSpeed's
    torch.testing.assert_close(result, scale * torch.where(original >= 0, 1.0, -1.0))
    torch.testing.assert_close(worker_error[:15].view(3, 5), original - result)


def test_where_deepspeed_has_no_accelerator_for_the_target_its_cuda_ops_are_refused_saying_why(monkeypatch):
    """On a device DeepSpeed has no accelerator for (here a vendor's that torch.accelerator
    reports), DeepSpeed runs its CUDA accelerator, whose op builders ask nvcc for a CUDA device
    and fail deep inside: the program hears which op, and the way out (checked by hand with
    real DeepSpeed on the test accelerator, where "torch_adam": true trains)."""
    from conftest import install_fake
    from cudashim.errors import UnsupportedCudaAPI
    builder = types.ModuleType("deepspeed.ops.op_builder.builder")

    class CUDAOpBuilder:
        def load(self, verbose=True):
            return "built with nvcc"

    class FusedAdamBuilder(CUDAOpBuilder):
        name = "fused_adam"

    builder.CUDAOpBuilder = CUDAOpBuilder
    monkeypatch.setitem(sys.modules, builder.__name__, builder)
    install_fake("accelerator")
    with cudashim.activated("accelerator"):
        with pytest.raises(UnsupportedCudaAPI, match=r"^DeepSpeed's CUDA op 'fused_adam' is not supported by "
                                                     r"cudashim on the 'accelerator' backend: DeepSpeed has no "
                                                     r"accelerator for the 'musa' device.*\"torch_adam\": true"):
            FusedAdamBuilder().load()
    assert FusedAdamBuilder().load() == "built with nvcc"
