"""Every backend against its fake vendor: detection, the whole interface, the vendor's own
code paths, visible devices, and what a missing or broken vendor package says.

CUDA pass-through is left to test_passthrough.py (it changes nothing and patches nothing).
"""

import importlib
import inspect
import os
import sys

import pytest
import torch

from conftest import FAKES, copy_of_cudashim, fake_vendor_path, install_fake, installed_distribution, python, \
    use_fake_vendor

from cudashim import backends
from cudashim._settings import load
from cudashim.backends.base import Backend
from cudashim.errors import BackendUnavailableError, CudashimWarning

TESTED = [name for name in backends.names() if name != "cuda"]
DEVICE_TYPE = {"xpu": "xpu", "npu": "npu", "hpu": "hpu", "mps": "mps", "accelerator": "musa",
               "cpu": "cpu"}
VISIBLE = {"xpu": "ZE_AFFINITY_MASK", "npu": "ASCEND_RT_VISIBLE_DEVICES",
           "hpu": "HABANA_VISIBLE_MODULES"}


def build(name, **settings):
    """The backend as activation builds it: resolved (vendor imported), then constructed."""
    cls, _ = backends.resolve(name)
    return cls(load(**settings))


def interface_methods():
    """The public methods and properties of the backend interface."""
    return sorted(name for name, value in vars(Backend).items()
                  if not name.startswith("_") and (inspect.isfunction(value) or isinstance(value, property)))


def check_contract(backend, device_type):
    """Call every method of the interface and check what each answers."""
    answered = set()

    def answer(name, *args):
        answered.add(name)
        return getattr(backend, name)(*args)

    def answer_property(name):
        answered.add(name)
        return getattr(backend, name)

    assert backend.device_type == device_type
    count = answer("device_count")
    assert isinstance(count, int) and count >= 1
    assert answer("current_device") == 0
    answer("set_device", 0)
    answer("synchronize", None)
    assert isinstance(answer("get_device_name", None), str)
    assert answer("get_device_properties", None).total_memory > 0
    assert answer("get_device_capability", None) == (8, 0)
    assert isinstance(answer("is_bf16_supported"), bool)
    target = answer("target_device", 0)
    assert isinstance(target, torch.device) and target.type == device_type

    answer("manual_seed", 3)
    answer("manual_seed_all", 3)
    assert answer("initial_seed") == 3
    state = answer("get_rng_state", None)
    assert isinstance(state, torch.Tensor) and state.dtype == torch.uint8
    answer("set_rng_state", state, None)
    answer("seed")
    answer("seed_all")
    assert isinstance(answer("default_generator", 0), torch.Generator)

    stream = answer("current_stream", None)
    assert answer("default_stream", None) is not None
    answer("set_stream", stream)
    with answer("stream", stream) as entered:
        assert entered is stream
    answered.update({"Stream", "Event"})
    assert backend.Stream is not None
    event = backend.Event(enable_timing=True)
    event.record()
    assert backend.current_stream() is stream or backend.current_stream() == stream

    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        value = answer(name, None)
        assert isinstance(value, int) and value >= 0, name
    answer("reset_peak_memory_stats", None)
    assert isinstance(answer("memory_stats", None), dict)
    free, total = answer("mem_get_info", None)
    assert 0 <= free <= total
    answer("empty_cache")

    natives = answer("native_answers")            # each a C callable equal to its method
    assert all(native() == getattr(backend, name)() for name, native in natives.items())

    dtypes = answer("autocast_dtypes")
    assert dtypes and all(isinstance(d, torch.dtype) for d in dtypes)
    fast, how_known = answer("dtype_speeds")
    assert set(fast) == {torch.float16, torch.bfloat16} and how_known
    assert all(isinstance(speed, bool) for speed in fast.values())
    choices = answer("float16_matmul_choices")
    assert {choices.memory_bound, choices.compute_bound} <= {"as-asked", "bfloat16", "float32"}
    if fast[torch.float16]:                            # nothing to choose where float16 is fast
        assert (choices.memory_bound, choices.compute_bound) == ("as-asked", "as-asked")
    ops = answer("float16_op_choices")                 # {op: its timings and choice}
    assert all(timed["choice"] in ("as-asked", "float32") for timed in ops.values())
    if fast[torch.float16]:
        assert ops == {}
    assert answer("sdpa_backends")
    assert isinstance(answer("can_pin_memory"), bool)
    graphs = answer("native_graphs")                   # None: the fakes have no graphs of their own
    assert graphs is None or hasattr(graphs, backend.graph_class)
    collective = backend.collective
    answered.add("collective")
    assert isinstance(collective, str) and collective != "nccl"
    assert collective in answer("process_group_backend")
    assert backend.name in answer("describe")
    assert answer("device_module") is torch.get_device_module(device_type) is backend.module
    for name in ("absent_reason", "device_absent_reason", "vendor_package_found", "choose_collective"):
        answered.add(name)                                    # asked by resolve() and collective
    missing = set(interface_methods()) - answered
    assert not missing, f"the contract test does not ask: {sorted(missing)}"


@pytest.mark.parametrize("name", TESTED)
def test_detection_picks_the_backend_and_it_answers_the_whole_interface(name):
    install_fake(name)
    cls, reason = backends.resolve("auto")
    assert cls.name == name and "detected" in reason
    check_contract(cls(load()), DEVICE_TYPE[name])


@pytest.mark.parametrize("name", ["xpu", "npu", "hpu", "mps", "accelerator"])
def test_backends_reach_the_vendor_device_module(name):
    install_fake(name)
    backend = build(name)
    module = torch.get_device_module(DEVICE_TYPE[name])
    before = len(module.calls)
    backend.memory_allocated()
    backend.synchronize()
    backend.manual_seed(5)
    asked = module.calls[before:]
    assert {"synchronize", "manual_seed"} <= set(asked)
    assert ("memory_allocated" in asked) or name == "mps"   # MPS: current_allocated_memory


def test_a_memory_figure_the_vendor_keeps_nowhere_comes_from_those_it_keeps():
    """torchvulkan's module has no max_memory_reserved and its allocator is no DeviceAllocator
    for torch.accelerator: the peak comes from its figures, as the fake accelerator's here."""
    install_fake("accelerator")
    module = torch.get_device_module(DEVICE_TYPE["accelerator"])
    del module.max_memory_reserved                          # as torchvulkan's module has none
    assert "reserved_bytes.all.peak" not in module.memory_stats()
    backend = build("accelerator")
    held = torch.ones(1024, device=DEVICE_TYPE["accelerator"])
    peak = backend.max_memory_reserved()
    assert peak >= max(backend.memory_reserved(), backend.max_memory_allocated()) >= held.nbytes
    assert backend.memory_stats()["reserved_bytes.all.peak"] == peak
    assert backend._has_device_allocator is False                # torch.accelerator could not answer
    del held
    assert backend.max_memory_reserved() == peak               # the peak outlives the tensor
    backend.reset_peak_memory_stats()
    assert backend.max_memory_reserved() == max(backend.memory_reserved(), backend.max_memory_allocated())


def test_xpu_imports_ipex_only_when_torch_finds_no_xpu_and_uses_oneccl_without_xccl():
    assert "intel_extension_for_pytorch" not in sys.modules
    use_fake_vendor("xpu")
    cls, _ = backends.resolve("xpu")
    assert "intel_extension_for_pytorch" in sys.modules     # torch.xpu alone found no device
    assert "oneccl_bindings_for_pytorch" not in sys.modules   # not before a process group
    backend = cls(load())
    assert not torch.distributed.is_xccl_available()
    assert backend.process_group_backend() == "cpu:gloo,xpu:ccl"
    assert "oneccl_bindings_for_pytorch" in sys.modules
    assert torch.distributed.Backend.backend_capability["ccl"] == ["cpu", "xpu"]


def test_xpu_prefers_xccl_where_torch_has_it(monkeypatch):
    use_fake_vendor("xpu")
    monkeypatch.setattr(torch.distributed, "is_xccl_available", lambda: True)
    backend = build("xpu")
    assert backend.collective == "xccl" and "oneccl_bindings_for_pytorch" not in sys.modules


def test_xpu_without_xccl_or_oneccl_says_what_to_install():
    use_fake_vendor("xpu")
    sys.path.remove(str(FAKES / "vendors" / "xpu"))
    sys.path.insert(0, str(FAKES / "vendors" / "xpu"))           # ipex stays importable...
    sys.modules["oneccl_bindings_for_pytorch"] = None            # ...oneCCL does not import
    backend = build("xpu")
    with pytest.raises(BackendUnavailableError, match="oneccl_bind_pt.*CUDASHIM_COLLECTIVE"):
        backend.process_group_backend()
    assert build("xpu", collective="gloo").collective == "gloo"


def test_hpu_imports_habana_hccl_when_nccl_is_first_asked_for():
    use_fake_vendor("hpu")
    backend = build("hpu")
    assert "habana_frameworks.torch.distributed.hccl" not in sys.modules
    assert backend.process_group_backend() == "cpu:gloo,hpu:hccl"
    assert "habana_frameworks.torch.distributed.hccl" in sys.modules


def test_npu_uses_torch_npu_and_hccl():
    use_fake_vendor("npu")
    backend = build("npu")
    assert "torch_npu" in sys.modules and backend.get_device_name() == "Fake NPU"
    assert backend.process_group_backend() == "cpu:gloo,npu:hccl"


def test_generic_backend_takes_the_collective_the_vendor_registered_or_the_setting():
    install_fake("accelerator")
    assert build("accelerator").collective == "mccl"
    assert build("accelerator", collective="gloo").collective == "gloo"


def test_generic_backend_falls_back_to_torch_accelerator_where_the_module_is_silent():
    install_fake("accelerator")
    module = torch.get_device_module("musa")
    # (torch.accelerator.device_count() itself asks the module, so that one stays)
    for name in ("current_device", "set_device", "current_stream", "set_stream"):
        delattr(module, name)
    backend = build("accelerator")
    backend.set_device(0)
    assert backend.current_device() == 0
    stream = backend.current_stream()
    assert isinstance(stream, torch.Stream) and stream.device.type == "musa"
    backend.set_stream(stream)


def test_generic_backend_leaves_listed_accelerators_to_their_own_backend():
    use_fake_vendor("npu")
    importlib.import_module("torch_npu")
    assert "'npu', which has its own backend 'npu'" in backends.survey()["accelerator"]
    with pytest.raises(BackendUnavailableError, match="has its own backend 'npu'"):
        backends.resolve("accelerator")


def test_mps_is_one_device_on_gloo():
    install_fake("mps")
    backend = build("mps")
    assert backend.device_count() == 1 and backend.process_group_backend() == "gloo"
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):
        backend.set_device(1)
    assert backend.autocast_dtypes() == (torch.float16, torch.bfloat16)


@pytest.mark.parametrize("name", ["npu", "mps"])
def test_a_device_count_a_vendor_backend_cannot_honour_is_said_once(name):
    install_fake(name)
    with pytest.warns(CudashimWarning, match=f"the '{name}' backend shows the program its real devices"):
        backend = build(name, device_count=4)
    assert backend.device_count() == 1


# --- visible devices ------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(VISIBLE))
def test_cuda_visible_devices_becomes_the_vendor_variable(name, monkeypatch):
    import cudashim
    install_fake(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.delenv(VISIBLE[name], raising=False)
    cudashim.activate(name)
    assert os.environ[VISIBLE[name]] == "1,0"
    cudashim.deactivate()
    assert VISIBLE[name] not in os.environ


@pytest.mark.parametrize("name", sorted(VISIBLE))
def test_a_vendor_variable_already_set_wins(name, monkeypatch):
    import cudashim
    install_fake(name)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    monkeypatch.setenv(VISIBLE[name], "3")
    cudashim.activate(name)
    assert os.environ[VISIBLE[name]] == "3"
    cudashim.deactivate()
    assert os.environ[VISIBLE[name]] == "3"


# --- detection and what a missing vendor says ----------------------------------------
@pytest.mark.parametrize("name, words", [
    ("npu", "'torch_npu' is not installed (pip install torch-npu"),
    ("hpu", "'habana_frameworks.torch' is not installed (install the Intel Gaudi software"),
    ("xpu", "torch.xpu.is_available() is False (install a torch built for Intel GPUs"),
    ("mps", "torch.backends.mps.is_available() is False"),
    ("accelerator", "torch.accelerator reports no accelerator"),
])
def test_a_named_absent_backend_says_what_is_missing_and_how_to_install_it(name, words):
    import cudashim
    with pytest.raises(BackendUnavailableError, match=f"backend '{name}' cannot run here") as error:
        cudashim.activate(name)
    assert words in str(error.value)
    assert not cudashim.is_active()


def test_the_setting_beats_detection():
    import cudashim
    use_fake_vendor("npu")
    assert backends.resolve("auto")[0].name == "npu"
    assert cudashim.activate("cpu").name == "cpu"
    assert torch.zeros(1, device="cuda").device.type == "cpu"


def _make_present(name, monkeypatch):
    if name == "cuda":                 # real CUDA: only its check is faked (test_passthrough.py)
        from cudashim.backends.cuda import CUDABackend
        monkeypatch.setattr(CUDABackend, "absent_reason", classmethod(lambda cls: None))
    elif name != "cpu":
        install_fake(name)


# Each documented neighbour pair that the fakes can make present together (one PrivateUse1
# rename per process, so npu, hpu and the generic accelerator never meet).
ORDERED_PAIRS = [("cuda", "xpu"), ("cuda", "npu"), ("xpu", "npu"), ("xpu", "hpu"), ("npu", "mps"),
                 ("hpu", "mps"), ("mps", "accelerator"), ("xpu", "accelerator"), ("accelerator", "cpu"),
                 ("mps", "cpu")]


@pytest.mark.parametrize("first, second", ORDERED_PAIRS)
@pytest.mark.parametrize("installed_first", [True, False], ids=["installed-in-order", "installed-reversed"])
def test_detection_picks_the_earlier_of_two_present_backends(first, second, installed_first, monkeypatch):
    order = backends.detection_order()
    assert order.index(first) < order.index(second)
    for name in ((first, second) if installed_first else (second, first)):
        _make_present(name, monkeypatch)
    assert backends.resolve("auto")[0].name == first
    assert backends.survey()[second] == "present"


def test_a_vendor_package_adds_a_backend_through_an_entry_point(tmp_path):
    """A package cudashim has no code for registers ``cudashim.backends``; detection tries it
    before the generic backend, which leaves its device type to it."""
    (tmp_path / "musa_shim_backend.py").write_text(
        "from cudashim.backends.accelerator import AcceleratorBackend\n"
        "class MusaBackend(AcceleratorBackend):\n"
        "    name = 'musa'\n"
        "    device_type = 'musa'\n"
        "    visible_devices_var = 'MUSA_VISIBLE_DEVICES'\n"
        "    def __init__(self, settings):\n"
        "        super().__init__(settings)\n"
        "        self.device_type = 'musa'\n")
    installed_distribution(tmp_path, "musa-shim-backend",
                           "[cudashim.backends]\nmusa = musa_shim_backend:MusaBackend\n")
    code = ("import torch, torch_musa, cudashim\n"
            "from cudashim import backends\n"
            "torch_musa._autoload()\n"
            "print(backends.detection_order())\n"
            "print(backends.survey()['accelerator'])\n"
            "backend = cudashim.activate()\n"
            "print(backend.name, backend.visible_devices_var, torch.zeros(1, device='cuda').device)\n")
    result = python("-c", code, env={"PYTHONPATH": os.pathsep.join([str(tmp_path), fake_vendor_path("musa")])})
    assert result.returncode == 0, result.stderr
    order, generic, chosen = result.stdout.strip().splitlines()
    assert order == str(("cuda", "xpu", "npu", "hpu", "mps", "musa", "accelerator", "cpu"))
    assert "which has its own backend 'musa'" in generic
    assert chosen == "musa MUSA_VISIBLE_DEVICES musa:0"


def test_entry_points_are_read_as_importlib_metadata_reads_them(tmp_path, monkeypatch):
    """Only distributions with a section named for a cudashim group are parsed, and among those
    of one name the first on the path counts: what is found is what importlib.metadata's
    entry_points() selects, a shadowed distribution's groups left out."""
    from importlib.metadata import entry_points

    from cudashim import plugins
    first, later = tmp_path / "first", tmp_path / "later"
    first.mkdir(), later.mkdir()
    # A newer release earlier on the path no longer declares the backend its older one did.
    installed_distribution(first, "moved-backend", "[console_scripts]\nmoved = moved.cli:main\n")
    installed_distribution(later, "moved-backend", "[cudashim.backends]\nmoved = moved:MovedBackend\n")
    installed_distribution(later, "both-groups", "[console_scripts]\nboth = cudashim.cli:main\n"
                           "[cudashim.patch_groups]\nboth = both_group\n"
                           "[cudashim.backends]\nboth = both_backend:BothBackend\n")
    # Names cudashim in its values only: it declares no group of ours.
    installed_distribution(later, "mentions-only", "[console_scripts]\nx = cudashim.backends.cpu:main\n")
    monkeypatch.syspath_prepend(str(later))
    monkeypatch.syspath_prepend(str(first))
    plugins._entry_points.cache_clear()
    everything = entry_points()
    for group, expected in ((plugins.BACKENDS, {"both": "both_backend:BothBackend"}),
                            (plugins.PATCH_GROUPS, {"both": "both_group"})):
        selected = everything.select(group=group) if hasattr(everything, "select") else everything[group]
        assert plugins.registered(group, ()) == {entry.name: entry.value for entry in selected} == expected


def test_a_broken_vendor_package_is_reported_and_detection_moves_on(tmp_path):
    broken = tmp_path / "torch_npu"
    broken.mkdir()
    (broken / "__init__.py").write_text("raise OSError('libascendcl.so: cannot open shared object file')\n")
    sys.path.insert(0, str(tmp_path))
    reason = backends.backend_class("npu").absent_reason()
    assert "'torch_npu' failed to import (OSError: libascendcl.so" in reason
    assert backends.resolve("auto")[0].name == "cpu"


def test_doctor_shows_every_backend_and_why_it_is_absent():
    from conftest import fake_vendor_path
    result = python("-c", "from cudashim.cli import main; main()", "doctor", env={"PYTHONPATH": fake_vendor_path("npu")})
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines()
             if line.startswith("  ") and line.split()[0] in backends.names()}
    assert set(lines) == set(backends.names())
    assert "present" in lines["npu"] and "absent: " in lines["hpu"] and "Gaudi" in lines["hpu"]
    assert "chosen backend: npu" in result.stdout
    assert "NCCL becomes 'cpu:gloo,npu:hccl'" in result.stdout
    assert "self-check: pass" in result.stdout


@pytest.mark.parametrize("name", ["npu", "accelerator"])
def test_delegated_calls_reach_the_device_module_without_passing_through_the_shim(name, monkeypatch):
    """The backend resolves its device module once, before patching: a torch.cuda call on the
    target never goes back through cudashim's own torch.get_device_module patch."""
    import cudashim
    install_fake(name)
    backend = cudashim.activate(name)
    calls = []
    patched = torch.get_device_module
    monkeypatch.setattr(torch, "get_device_module", lambda *args: calls.append(args) or patched(*args))
    torch.cuda.synchronize()
    torch.cuda.memory_allocated(0)
    torch.cuda.current_stream()
    assert torch.cuda.device_count() == backend.device_count() >= 1
    assert calls == []


def test_a_built_in_backend_is_one_module_found_by_its_name(tmp_path, monkeypatch):
    """A module dropped into cudashim/backends/ is a backend: named for its module, tried where
    its class says, with nothing else to edit."""
    package = copy_of_cudashim(tmp_path)
    (package / "backends" / "ipu.py").write_text(
        "from .accelerator import AcceleratorBackend\n"
        "class IPUBackend(AcceleratorBackend):\n"
        "    name = 'ipu'\n"
        "    detection_rank = 45\n"
        "    @classmethod\n"
        "    def absent_reason(cls):\n"
        "        return 'no IPU here'\n")
    code = ("import torch\n"
            "from cudashim import backends\n"
            "print(backends.built_in())\n"
            "print(backends.detection_order())\n"
            "print(backends.survey()['ipu'])\n")
    result = python("-c", code, env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    built_in, order, state = result.stdout.strip().splitlines()
    assert "'ipu'" in built_in and "'base'" not in built_in and "'host'" not in built_in
    assert order == str(("cuda", "xpu", "npu", "hpu", "mps", "ipu", "accelerator", "cpu"))
    assert state == "absent: no IPU here"


def test_staged_collectives_keep_their_host_buffers_one_collective_at_a_time():
    from cudashim.backends.staged import StagingBuffers
    staging = StagingBuffers()
    like = torch.ones(4, 3)
    first = staging.take(like)
    assert first.shape == (4, 3) and first.dtype == torch.float32 and first.is_contiguous()
    taken_meanwhile = staging.take(like)            # another collective, while the first runs
    assert taken_meanwhile.data_ptr() != first.data_ptr()
    staging.give_back([first, taken_meanwhile])
    again = [staging.take(torch.ones(12)), staging.take(torch.ones(2, 6))]   # any shape of that size
    assert {t.data_ptr() for t in again} == {first.data_ptr(), taken_meanwhile.data_ptr()}
    assert staging.take(torch.ones(12, dtype=torch.float64)).data_ptr() not in {t.data_ptr() for t in again}
    staging.give_back(again)
    # past what it keeps, a buffer given back is freed
    staging.KEPT_BYTES = 2 * 12 * 4 + 8
    staging.give_back([torch.empty(12)])
    assert staging.take(torch.ones(12)).data_ptr() in {t.data_ptr() for t in again}
    assert staging.take(torch.ones(12)).data_ptr() in {t.data_ptr() for t in again}
    assert staging.take(torch.ones(12)).data_ptr() not in {t.data_ptr() for t in again}


def test_a_staged_receive_completes_after_its_copy_back_and_raises_what_failed():
    """A receive into a device tensor is a work of its own: complete once the host copy is back
    in the tensor (written without autograd: a pipeline's receive buffer requires grad), and
    its failure raised by wait(), as gloo's own work raises it."""
    from cudashim.backends.staged import StagingBuffers, _pending_receive_class

    class Received:                                  # gloo's work, once the bytes are in
        def __init__(self, error=None):
            self.error = error

        def wait(self):
            if self.error:
                raise self.error
            return True

    buffer = torch.zeros(3, requires_grad=True)
    host = torch.full((3,), 7.0)
    work = _pending_receive_class()(Received(), [(buffer, host)], StagingBuffers())
    assert work.wait() is True and work.is_completed() and work.exception() is None
    assert buffer.tolist() == [7.0, 7.0, 7.0] and buffer.requires_grad
    failed = _pending_receive_class()(Received(RuntimeError("peer went away")), [(torch.zeros(3), host)],
                                      StagingBuffers())
    with pytest.raises(RuntimeError, match="peer went away"):
        failed.wait()
    assert isinstance(failed.exception(), RuntimeError)
