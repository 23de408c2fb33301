import sys
import threading

import pytest

from conftest import python


def _snapshot(constructors):
    """Every object cudashim may patch, by identity."""
    import torch
    import torch.distributed as dist

    objects = {f"{o.__name__}.{n}": getattr(o, n) for o, n in constructors}
    for name in ("to", "cuda", "type", "new_empty", "new_zeros", "new_ones", "new_full",
                 "new_tensor", "pin_memory", "is_pinned", "record_stream", "get_device"):
        objects[f"Tensor.{name}"] = torch.Tensor.__dict__.get(name, "<inherited>")
    objects["Tensor.is_cuda"] = torch.Tensor.__dict__.get("is_cuda", "<inherited>")
    for name in ("device", "Generator", "load", "cuda", "set_default_device", "get_device_module",
                 "is_autocast_enabled", "get_autocast_dtype"):
        objects[f"torch.{name}"] = getattr(torch, name)
    objects["autocast.__init__"] = torch.amp.autocast_mode.autocast.__init__
    objects["GradScaler.__init__"] = torch.amp.grad_scaler.GradScaler.__init__
    objects["Module.to"] = torch.nn.Module.to
    objects["DataLoader.__init__"] = torch.utils.data.DataLoader.__init__
    objects["init_process_group"] = dist.init_process_group
    objects["sdpa_kernel"] = torch.nn.attention.sdpa_kernel
    objects["profile.__init__"] = torch.profiler.profile.__init__
    for name, module in sys.modules.items():
        if name == "torch.cuda" or name.startswith("torch.cuda."):
            objects[f"sys.modules[{name}]"] = module
    return objects


def test_deactivate_restores_every_identity():
    import torch
    import cudashim
    from cudashim.patches.factories import constructors

    found = constructors()                   # found by identity: before activation
    before = _snapshot(found)
    cudashim.activate("cpu")
    during = _snapshot(found)
    changed = [k for k in before if before[k] is not during[k]]
    assert len(changed) > 40, "activation should have patched the surface"
    cudashim.deactivate()
    after = _snapshot(found)
    assert [k for k in before if before[k] is not after[k]] == []
    assert not cudashim.is_active() and cudashim.current_backend() is None
    assert torch.Tensor.cuda is torch._C.TensorBase.cuda


def test_activate_twice_is_harmless_and_reactivation_works():
    import torch
    import cudashim

    first = cudashim.activate("cpu")
    patched = torch.Tensor.to
    assert cudashim.activate() is first
    assert torch.Tensor.to is patched
    cudashim.deactivate()
    cudashim.activate("cpu")
    assert torch.zeros(1, device="cuda").is_cuda
    cudashim.deactivate()


def test_concurrent_activation_patches_once():
    """Eight threads activating at once patch what one activation patches: each name as many
    times (a name two groups stack their patches on, as the precision policy and the exact
    reductions do on torch.linalg.vector_norm, is patched twice by one activation too)."""
    import collections

    import torch
    import cudashim

    def patched(registry):        # an entry keyed by an object's id: counted by its mapping
        return collections.Counter((id(p.owner), p.name if isinstance(p.name, str) else "an id")
                                   for p in registry)
    cudashim.activate("cpu")
    alone = patched(cudashim.activation.current_activation().registry)
    cudashim.deactivate()
    results = []
    threads = [threading.Thread(target=lambda: results.append(cudashim.activate("cpu")))
               for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({id(r) for r in results}) == 1
    assert patched(cudashim.activation.current_activation().registry) == alone, "something was patched twice"
    cudashim.deactivate()


def _activated_before_torch(*lines):
    """What a program prints that activates cudashim before torch is imported, then runs ``lines``."""
    code = "\n".join(("import sys, cudashim",
                      "assert cudashim.activate('cpu') is None and 'torch' not in sys.modules", *lines))
    result = python("-c", code + "\n")
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_activation_before_torch_is_imported_waits_for_it():
    assert _activated_before_torch(
        "import torch",
        "assert torch.zeros(2, device='cuda').is_cuda",
        "print(cudashim.current_backend().name)") == ["cpu"]


def test_activation_before_torch_waits_for_cudashims_own_module_that_imports_it():
    """``from cudashim.kernels import packbits`` before ``import torch``: the package imports torch
    on its first line, and activation, which imports from it, waits for it to be whole."""
    assert _activated_before_torch(
        "import warnings",
        "warnings.simplefilter('error')",
        "from cudashim.kernels import packbits",
        "import cudashim.kernels.packed_convolution",
        "import torch",
        "bits = torch.tensor([True, False, True] + [False] * 5).cuda()",
        "print(cudashim.current_backend().name, torch.cuda.is_available(), packbits(bits).is_cuda)",
    ) == ["cpu", "True", "True"]


def test_activation_before_torch_serves_the_stand_ins_a_program_imports_before_torch():
    """isort puts ``apex`` and ``flash_attn`` before ``torch``: their import completes the
    activation that waits for torch, so the stand-ins answer, as under ``python -m cudashim``."""
    assert _activated_before_torch(
        "from apex.optimizers import FusedAdam",
        "from flash_attn import flash_attn_func",
        "import torch",
        "q = torch.randn(1, 4, 2, 8, device='cuda', dtype=torch.float16)",
        "weight = torch.nn.Parameter(torch.ones(3, device='cuda'))",
        "weight.sum().backward()",
        "FusedAdam([weight], lr=0.1).step()",
        "print(flash_attn_func(q, q, q, causal=True).is_cuda, weight.is_cuda, bool((weight < 1).all()),",
        "      sys.modules['flash_attn'].__file__.startswith(cudashim.__path__[0]))",
    ) == ["True", "True", "True", "True"]


def test_importing_cudashim_imports_no_torch_and_cpu_imports_no_vendor_package():
    code = (
        "import sys, cudashim\n"
        "assert 'torch' not in sys.modules\n"
        "import torch; cudashim.activate('cpu')\n"
        "vendors = ['intel_extension_for_pytorch', 'torch_npu', 'habana_frameworks', 'cupy']\n"
        "print([v for v in vendors if v in sys.modules])\n")
    result = python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_activated_context_manager_scopes_the_shim():
    import torch
    import cudashim

    with cudashim.activated("cpu") as backend:
        assert backend.name == "cpu" and torch.cuda.is_available()
    assert not cudashim.is_active()
    assert not torch.cuda.is_available()


def test_a_failed_activation_leaves_nothing_active():
    import gc
    import torch
    import cudashim
    from cudashim.errors import BackendUnavailableError

    with pytest.raises(BackendUnavailableError, match="no working CUDA device"):
        cudashim.activate("cuda")
    assert gc.isenabled(), "the garbage collector paused for activation is running again"
    assert gc.get_freeze_count() == 0, "a failed activation freezes nothing"
    assert not cudashim.is_active() and cudashim.activation.current_activation() is None
    assert torch.Tensor.to is torch._C.TensorBase.to
    assert cudashim.activate("cpu").name == "cpu"
    cudashim.deactivate()


@pytest.mark.parametrize("collecting", [True, False], ids=["collector-on", "collector-off"])
def test_activation_runs_none_of_the_programs_garbage_collections(collecting):
    """``import torch`` leaves a full collection due; the program runs it, not activation,
    whose thousands of allocations would otherwise start it. What exists at activation lives as
    long as the program: it is frozen, where no collection of the program's, nor the
    interpreter's at exit, walks it; deactivation gives it back to the collector."""
    import gc
    import weakref
    import torch  # noqa: F401  (imported: activation is at once)
    import cudashim

    class Node:
        pass

    gc.collect()                                     # every generation's count at zero
    made_before = Node()
    made_before.itself = made_before                 # a cycle the program had before activation
    started = []
    gc.callbacks.append(lambda phase, info: started.append(info["generation"]) if phase == "start" else None)
    if not collecting:
        gc.disable()
    cudashim.activate("cpu")
    activation = cudashim.activation.current_activation()
    kept = [[] for _ in range(500)]                  # the allocations that follow: under gen 0's threshold
    # Unpaused, activation starts some twenty young collections and two of the middle
    # generation; paused and left young, the first allocation after it starts a young
    # collection that walks all of activation's objects.
    assert started == []
    assert gc.isenabled() is collecting, "the collector is left as the program had it"
    in_sight = gc.get_objects()
    assert any(kept is thing for thing in gc.get_objects(generation=0))
    # A program that pauses the collector keeps what it made in sight, ours with it.
    assert any(activation is thing for thing in in_sight) is not collecting
    assert any(made_before is thing for thing in in_sight) is not collecting
    assert (gc.get_freeze_count() > 0) is collecting

    made_after = Node()
    made_after.itself = made_after
    cudashim.activate("cpu")                         # in force already: nothing more is frozen
    assert any(made_after is thing for thing in gc.get_objects())
    dropped = weakref.ref(made_after)
    del made_after
    gc.collect()
    assert dropped() is None, "the program's own cycles are collected as ever"
    cudashim.deactivate()
    assert gc.get_freeze_count() == 0
    assert any(made_before is thing for thing in gc.get_objects())


def test_an_activation_waiting_for_torch_freezes_at_its_import_and_deactivation_unfreezes():
    """``python -m cudashim`` and the image hook activate before torch is imported: what exists
    is frozen once torch's import has installed the patches, not before."""
    code = (
        "import gc, cudashim\n"
        "cudashim.activate('cpu')\n"
        "assert gc.get_freeze_count() == 0, 'frozen before torch was imported'\n"
        "import torch\n"
        "assert cudashim.current_backend().name == 'cpu' and gc.get_freeze_count() > 0\n"
        "cudashim.deactivate()\n"
        "print(gc.get_freeze_count())\n")
    result = python("-c", code, fresh=True)   # the zygote froze its own objects before forking
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"


def test_objects_the_program_froze_stay_frozen_through_activation():
    """A program that froze its objects (a server before it forks its workers) keeps them out
    of every collection, through activation and deactivation."""
    import gc
    import cudashim                                  # torch is imported: activation is at once

    kept = [[]]                                      # the program's own: frozen, in no generation
    gc.freeze()
    cudashim.activate("cpu")
    assert gc.get_freeze_count() > 0
    assert not any(kept is thing for thing in gc.get_objects())
    cudashim.deactivate()
    assert not any(kept is thing for thing in gc.get_objects())
    gc.unfreeze()


def test_one_activation_object_holds_what_was_chosen_and_is_handed_to_the_patches():
    import torch
    import cudashim
    from cudashim.registry import PatchRegistry
    cudashim.activate("cpu", report=True)
    activation = cudashim.activation.current_activation()
    assert activation.backend is cudashim.current_backend() and activation.backend.name == "cpu"
    assert activation.settings.backend == "cpu" and activation.reason == "named explicitly"
    assert isinstance(activation.registry, PatchRegistry) and len(activation.registry) > 50
    assert activation.report is not None and activation.translator.report is activation.report
    assert cudashim.get_original(torch, "zeros") is not torch.zeros
    cudashim.deactivate()
    assert not activation.live and len(activation.registry) == 0
    assert cudashim.get_original(torch, "zeros") is torch.zeros


@pytest.mark.parametrize("hook_module", [
    "torch._utils_internal",      # early in torch's __init__: no torch.Tensor yet
    "torch.backends.mps",         # late: most of torch is there
])
def test_activation_asked_for_while_torch_imports_waits_for_the_import_to_finish(hook_module):
    """A post-import hook of a module torch imports (or a torch.backends entry point) runs
    while torch is half-imported; activation then happens when torch's import finishes."""
    code = (
        "import sys, warnings, wrapt, cudashim\n"
        "warnings.simplefilter('error')\n"
        f"wrapt.register_post_import_hook(lambda m: cudashim.activate('cpu'), {hook_module!r})\n"
        "import torch\n"
        "assert sys.getprofile() is None\n"
        "print(torch.zeros(2, device='cuda').is_cuda, cudashim.current_backend().name)\n")
    result = python("-c", code, fresh=True)   # torch's import itself runs
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True cpu"


def test_activation_from_another_thread_waits_for_torch_to_finish_importing():
    code = (
        "import sys, threading, time, cudashim, wrapt\n"
        "started = threading.Event()\n"
        "def slow(module):\n"
        "    started.set(); time.sleep(0.5)\n"
        "wrapt.register_post_import_hook(slow, 'torch._utils_internal')\n"
        "results = []\n"
        "def other():\n"
        "    started.wait(); results.append(cudashim.activate('cpu'))\n"
        "thread = threading.Thread(target=other); thread.start()\n"
        "import torch\n"
        "thread.join()\n"
        "print(results[0].name, torch.zeros(2, device='cuda').is_cuda)\n")
    result = python("-c", code, fresh=True)   # torch's import itself runs
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "cpu True"


def test_activate_deactivate_cycles_leave_nothing_behind():
    """Nothing of an activation outlives it: post-import hooks for modules never imported,
    exit handlers and caches let go of the activation, its backend and its settings."""
    import gc
    import torch  # noqa: F401  (imported: each activation patches it)
    import cudashim

    def cycles(count):
        for _ in range(count):
            cudashim.activate("cpu")
            cudashim.deactivate()
        gc.collect()
        return len(gc.get_objects())

    settled = cycles(20)
    after = cycles(200)
    assert after - settled < 20, f"{(after - settled) / 200:.1f} objects kept per cycle"
    assert not [o for o in gc.get_objects() if type(o).__name__ == "Activation"]


def test_the_exit_drain_is_armed_for_device_threads_only_and_undone_with_the_rest(monkeypatch):
    """Where tensors live on a device, torch's autograd engine runs their backward on a thread
    of its own, which cudashim drains at exit (cudashim/autograd_exit.py); on the CPU backend
    there is none to drain, and deactivation drains them at once instead (a program may end
    right after it)."""
    import atexit
    import os
    import types

    import torch

    from cudashim import autograd_exit
    from cudashim.registry import PatchRegistry

    exit_hooks, drained = [], []
    monkeypatch.setattr(atexit, "register", exit_hooks.append)
    monkeypatch.setattr(atexit, "unregister", exit_hooks.remove)

    def armed(device_type):
        backend = types.SimpleNamespace(device_type=device_type, device_module=lambda: torch.cpu,
                                        device_count=lambda: drained.append(1) or 0)
        activation = types.SimpleNamespace(backend=backend, registry=PatchRegistry())
        autograd_exit.arm(activation)
        hooks = drains()
        activation.registry.revert_all()
        return hooks, drains()

    def drains():          # a drain imports torch, whose import registers exit hooks of its own
        return [hook.func for hook in exit_hooks if getattr(hook, "func", None) is autograd_exit.drain_device_threads]

    assert armed("cpu") == ([], []) and not drained
    assert armed("xpu") == ([autograd_exit.drain_device_threads], []) and drained
    drained.clear()            # a child forked after arming has none of its parent's threads
    armed_in_the_parent = os.getpid() + 1
    autograd_exit.drain_device_threads(types.SimpleNamespace(device_count=lambda: drained.append(1) or 0),
                                       armed_in_the_parent)
    assert not drained


def test_the_exit_drain_runs_on_the_devices_that_held_memory():
    """Only a device that held the program's tensors can have run its backward; a device that
    keeps no figures counts as used where it is the current one, and none does where the
    device's runtime never started."""
    import types

    from cudashim import autograd_exit

    class Backend:
        figures = {0: 0, 1: 4096, 2: None, 3: 0}      # None: the vendor keeps no figure
        peaks = {0: 512, 1: 4096, 2: None, 3: 0}
        started = True

        def device_module(self):
            return types.SimpleNamespace(is_initialized=lambda: self.started)

        def device_count(self):
            return 5

        def target_device(self, index):
            return f"xpu:{min(index, 3)}"              # logical device 4 shares real device 3

        def current_device(self):
            return 2

        def memory_allocated(self, index):
            return self._read(self.figures, index)

        def max_memory_allocated(self, index):
            return self._read(self.peaks, index)

        @staticmethod
        def _read(figures, index):
            if figures[min(index, 3)] is None:
                raise RuntimeError("no figures")
            return figures[min(index, 3)]

    backend = Backend()
    assert autograd_exit.devices_used(backend) == ["xpu:0", "xpu:1", "xpu:2"]
    backend.started = False
    assert autograd_exit.devices_used(backend) == []
