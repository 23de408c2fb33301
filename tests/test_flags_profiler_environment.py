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


# --- NCCL's variables -------------------------------------------------------------------
@pytest.mark.parametrize("pattern, chosen", [
    ("eth", ["eth0", "eth1"]),                    # prefixes, as NCCL reads them
    ("=eth1", ["eth1"]),                          # an exact name
    ("=eth", []),
    ("ib,eth1", ["eth1", "ib0"]),                 # the machine's order
    ("^eth", ["ib0", "lo"]),                      # excluded; loopback last
    ("^=eth0", ["eth1", "ib0", "lo"]),
])
def test_nccl_socket_ifname_selects_as_nccl_does(pattern, chosen):
    from cudashim.patches._nccl_environment import matching_interfaces
    assert matching_interfaces(pattern, ["lo", "eth0", "eth1", "ib0"]) == chosen


def _map(environ, libraries=("gloo",)):
    from cudashim.patches import _nccl_environment
    set_items = []

    def set_item(mapping, name, value):
        set_items.append((name, value))
        mapping[name] = value

    interfaces = lambda: ["lo", "eth0"]                    # noqa: E731
    original = _nccl_environment.machine_interfaces
    _nccl_environment.machine_interfaces = interfaces
    try:
        became = dict(_nccl_environment.apply(environ, libraries, set_item))
    finally:
        _nccl_environment.machine_interfaces = original
    return became, set_items


def test_nccl_variables_become_what_each_library_reads():
    became, set_items = _map({"NCCL_SOCKET_IFNAME": "eth", "NCCL_DEBUG": "INFO", "NCCL_IB_DISABLE": "1",
                              "TORCH_NCCL_BLOCKING_WAIT": "1", "PATH": "/bin"}, ("gloo", "hccl"))
    assert set_items == [("TORCH_DISTRIBUTED_DEBUG", "INFO"), ("GLOO_SOCKET_IFNAME", "eth0"),
                         ("HCCL_SOCKET_IFNAME", "eth"),     # HCCL reads NCCL's syntax itself
                         ("TORCH_HCCL_BLOCKING_WAIT", "1"), ("HCCL_BLOCKING_WAIT", "1")]
    assert became["NCCL_IB_DISABLE"].startswith("no effect on gloo: tunes NCCL's own transports")
    assert became["TORCH_NCCL_BLOCKING_WAIT"].startswith("nothing to set for gloo: gloo's collectives")
    assert "no effect on hccl" in became["NCCL_DEBUG"]
    assert set(became) == {"NCCL_SOCKET_IFNAME", "NCCL_DEBUG", "NCCL_IB_DISABLE", "TORCH_NCCL_BLOCKING_WAIT"}


def test_each_vendor_library_gets_its_own_spelling_of_a_job_scripts_nccl_setup():
    job = {"NCCL_SOCKET_IFNAME": "^lo", "NCCL_DEBUG": "INFO", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "TORCH_NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": "600",
           "TORCH_NCCL_DESYNC_DEBUG": "1", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1"}
    became, set_items = _map(dict(job), ("gloo", "xccl"))          # Intel's GPUs: oneCCL
    assert dict(set_items) == {"TORCH_DISTRIBUTED_DEBUG": "INFO", "CCL_LOG_LEVEL": "info",
                               "GLOO_SOCKET_IFNAME": "eth0", "CCL_KVS_IFACE": "eth0", "FI_TCP_IFACE": "eth0",
                               "TORCH_XCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_XCCL_BLOCKING_WAIT": "1"}
    assert "gloo has no watchdog thread" in became["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]
    assert "no effect on xccl: the library has no desync report" in became["TORCH_NCCL_DESYNC_DEBUG"]
    assert became["TORCH_NCCL_DUMP_ON_TIMEOUT"].startswith("no effect on gloo: configures torch's NCCL")
    became, set_items = _map(dict(job), ("gloo", "hccl"))          # Ascend's and Gaudi's HCCL
    assert {name: value for name, value in set_items if name.startswith(("HCCL", "TORCH_HCCL"))} == {
        "HCCL_SOCKET_IFNAME": "^lo", "HCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_HCCL_BLOCKING_WAIT": "1",
        "HCCL_BLOCKING_WAIT": "1", "HCCL_DESYNC_DEBUG": "1"}
    assert "no effect on hccl: the library keeps its own log level" in became["NCCL_DEBUG"]


def test_the_libraries_own_variables_win_and_an_unmatched_interface_is_said(recwarn):
    became, set_items = _map({"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "lo", "NCCL_DEBUG": "WARN"})
    assert set_items == [] and became["NCCL_SOCKET_IFNAME"] == "GLOO_SOCKET_IFNAME=lo (already set, kept)"
    assert became["NCCL_DEBUG"] == "TORCH_DISTRIBUTED_DEBUG not set"          # WARN is c10d's default
    became, set_items = _map({"NCCL_SOCKET_IFNAME": "ib"})
    assert set_items == [] and any("NCCL_SOCKET_IFNAME=ib selects none of this machine's interfaces (lo, "
                                   "eth0)" in str(w.message) for w in recwarn)


def test_nccl_variables_are_mapped_while_active_and_taken_back_after(monkeypatch):
    import os
    import torch.distributed as dist
    import cudashim
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=lo")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv("TORCH_DISTRIBUTED_DEBUG", raising=False)
    level = dist.get_debug_level()
    with cudashim.activated("cpu", report=True):
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["TORCH_DISTRIBUTED_DEBUG"] == "INFO"
        assert dist.get_debug_level() == dist.DebugLevel.INFO
        from cudashim.activation import current_activation
        report = current_activation().report.entries
        assert report["$NCCL_SOCKET_IFNAME"]["became"] == "GLOO_SOCKET_IFNAME=lo"
    assert "GLOO_SOCKET_IFNAME" not in os.environ and "TORCH_DISTRIBUTED_DEBUG" not in os.environ
    assert dist.get_debug_level() == level
