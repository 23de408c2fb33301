import pytest
import torch
import torch.nn.functional as F


def test_sdpa_kernel_without_a_target_kernel_falls_back_and_warns_once(shim):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    q = torch.randn(1, 2, 8, 16, device="cuda")
    with pytest.warns(shim.CudashimWarning, match="math kernel"):
        with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION]):
            F.scaled_dot_product_attention(q, q, q)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):          # the CPU has this one: no fallback
        F.scaled_dot_product_attention(q, q, q)
    with torch.backends.cuda.sdp_kernel(enable_flash=False, enable_math=False, enable_mem_efficient=True):
        F.scaled_dot_product_attention(q, q, q)
    # the fallback unwinds before torch's context manager restores the program's flags
    assert torch.backends.cuda.math_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()


def test_cuda_flags_are_accepted(shim):
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    assert torch.backends.cudnn.benchmark and torch.backends.cuda.matmul.allow_tf32


def test_profiler_cuda_activity_is_dropped_on_the_cpu(shim):
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        torch.ones(4, device="cuda").sum()
    assert ProfilerActivity.CUDA not in prof.activities
    assert any("aten::sum" in e.name for e in prof.events())


@pytest.mark.parametrize("visible, expected", [("0,1", 2), ("", 0), ("3", 1), ("0,-1,2", 1)])
def test_cuda_visible_devices_sets_the_virtual_device_count(monkeypatch, visible, expected):
    import cudashim
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    cudashim.activate("cpu")
    assert torch.cuda.device_count() == expected
    assert torch.cuda.is_available() is (expected > 0)
    cudashim.deactivate()


def test_device_count_setting_beats_cuda_visible_devices(monkeypatch):
    import cudashim
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("CUDASHIM_DEVICE_COUNT", "4")
    cudashim.activate("cpu")
    assert torch.cuda.device_count() == 4
    cudashim.deactivate()
