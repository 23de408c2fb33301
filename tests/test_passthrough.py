"""On a machine with working CUDA cudashim patches nothing unless a backend is named."""

import pytest
import torch

from cudashim.backends.cuda import CUDABackend


@pytest.fixture
def cuda_works(monkeypatch):
    """This machine's real-CUDA check answers yes (the only part of CUDA detection faked)."""
    monkeypatch.setattr(CUDABackend, "absent_reason", classmethod(lambda cls: None))


def test_real_cuda_is_passed_through_untouched(cuda_works, caplog):
    import logging
    import cudashim
    caplog.set_level(logging.INFO, logger="cudashim")
    backend = cudashim.activate()
    assert backend.name == "cuda" and not backend.redirects
    assert len(cudashim.activation.current_activation().registry) == 0
    assert torch.Tensor.cuda is torch._C.TensorBase.cuda
    assert "passing through, nothing patched" in caplog.text
    cudashim.deactivate()


def test_an_explicit_backend_forces_redirection(cuda_works):
    import cudashim
    assert cudashim.activate("cpu").name == "cpu"
    assert torch.zeros(1, device="cuda").device.type == "cpu"
    cudashim.deactivate()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a real CUDA device")
def test_on_real_cuda_tensors_stay_on_cuda():
    import cudashim
    cudashim.activate()
    assert torch.zeros(1, device="cuda").device.type == "cuda"
    cudashim.deactivate()
