"""``cudashim doctor``: what cudashim sees on this machine, and a self-check.

What a bug report needs, in the spirit of ``torch.utils.collect_env``: versions, the chosen
backend and why, devices, collectives, policies, vendor packages, and whether a small
CUDA-style program runs.
"""

from __future__ import annotations

import io
import platform
import sys
import traceback

from . import __version__, backends, callers, speedups
from .backends import staged
from .kernels import native
from .backends.base import module_found
from .cuda_build import heard_version
from .errors import BackendUnavailableError

def vendor_packages():
    """The packages the backends use where installed, each once, in the backends' order."""
    found = {}
    for name in backends.names():
        cls = backends.backend_class(name)
        found.update(dict.fromkeys((cls.vendor_package,) if cls.vendor_package else ()))
        found.update(dict.fromkeys(cls.optional_packages))
    return tuple(found)


def self_check() -> None:
    """A CUDA-style snippet: raises if anything in it fails under cudashim."""
    import torch

    device = torch.device("cuda")
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
    x = torch.randn(4, 8, device="cuda")
    assert x.is_cuda and next(model.parameters()).is_cuda, "tensors do not report is_cuda"
    scaler = torch.cuda.amp.GradScaler()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(x.to(device)).float().pow(2).mean()
    scaler.scale(loss).backward()
    end.record()
    torch.cuda.synchronize()
    assert start.elapsed_time(end) >= 0
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    model.load_state_dict(torch.load(buffer, map_location="cuda:0"))
    assert torch.cuda.is_available() and torch.cuda.device_count() >= 1


def kernel_gaps(settings) -> int:
    """``cudashim doctor --kernels``: what the target's kernels lack that CUDA's have (dtypes
    on the CPU, CUDA-only ops torch calls), and how each is filled."""
    import torch

    from .kernels.gap_fill import compute_dtype
    from .patches import kernel_gaps as gaps_group

    backends.load_devices(settings)
    backend_cls, _ = backends.resolve(settings.backend)
    device_type = backend_cls.accelerator_type() if backend_cls.name == backends.GENERIC \
        else backend_cls.device_type
    out = sys.stdout.write
    if device_type != "cpu":
        _accelerator_kernels(device_type, out)
        return 0
    out(_cuda_only_ops(device_type))
    found = gaps_group.gaps()
    out(f"kernel gaps on the CPU (torch {torch.__version__}): {len(found)} functions take dtypes "
        f"on CUDA that the CPU's kernels refuse; each computes in a wider dtype and casts back\n")
    width = max(len(f"{o.__name__}.{a}") for o, a, _, _ in found)
    for owner, attribute, dtypes, methods in found:
        fills = ", ".join(f"{str(d).replace('torch.', '')} in {str(compute_dtype(d)).replace('torch.', '')}"
                          for d in sorted(dtypes, key=str))
        also = f"  (also Tensor.{', Tensor.'.join(methods)})" if methods else ""
        out(f"  {owner.__name__ + '.' + attribute:{width}s}  {fills}{also}\n")
    from .tables.dtype_gaps import UNFILLED
    from .kernels.gap_fill import why_not_filled
    if UNFILLED:
        import textwrap
        out("found and not filled (these calls fail as they do natively):\n")
        by_dtype = {}
        for name, dtype_names in UNFILLED.items():
            for dtype_name in dtype_names:
                by_dtype.setdefault(dtype_name, []).append(f"torch.{name}")
        for dtype_name, names in sorted(by_dtype.items()):
            out(f"  {dtype_name}: {why_not_filled(getattr(torch, dtype_name))}\n")
            out(textwrap.fill(", ".join(names), width=96, initial_indent="    ",
                              subsequent_indent="    ") + "\n")
    return 0


def _cuda_only_ops(device_type: str) -> str:
    from .patches import kernel_gaps as gaps_group

    missing = ", ".join(f"aten::{name}" for name in gaps_group.missing_ops(device_type))
    return (f"CUDA-only ops torch calls (LSTM and GRU cells on accelerators, SyncBatchNorm) that "
            f"'{device_type}' lacks, computed by cudashim's portable kernels on the device: "
            f"{missing or 'none: the target has them all'}\n")


def _held_layouts(device_type: str) -> str:
    from .patches import layouts

    held = layouts.layouts_held(device_type)
    if not held:
        sparse = f"sparse layouts: '{device_type}' has sparse kernels of its own, or no sparse dispatch keys\n"
    else:
        sparse = (f"sparse layouts '{device_type}' has no kernels for: {' and '.join(held)}. Their ops run "
                  f"on the host, their results moved back (said once, each op counted by the report): "
                  f"COO tensors are held in host memory behind a '{device_type}' tensor, compressed ones "
                  f"keep their index and value tensors on '{device_type}'\n")
    if not layouts.lacks_nested_tensors(device_type):
        return sparse
    return sparse + (f"nested tensors: '{device_type}' has no kernels for them; nn.TransformerEncoder's "
                     f"nested-tensor path (inference over padded batches) runs its layers on the padded "
                     f"batch, padded positions zero as that path leaves them\n")


def _accelerator_kernels(device_type: str, out) -> None:
    import textwrap

    import torch

    from .patches import kernel_gaps as gaps_group

    out(f"dtype gaps: known for the CPU only (from torch's operator database); the "
        f"'{device_type}' kernels take the dtypes they take\n")
    key = gaps_group.dispatch_key(device_type)
    if key is None:
        out(f"ops: '{device_type}' has no dispatch key of its own; its kernels are used as they are\n")
        return
    out(_cuda_only_ops(device_type))
    out(_held_layouts(device_type))
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    host_only = sorted(name for name in torch._C._dispatch_get_all_op_names()
                       if name.startswith("aten::") and has(name, "CPU") and not has(name, key))
    if torch._C._dispatch_has_backend_fallback(getattr(torch._C.DispatchKey, key)):
        how = (f"the '{device_type}' extension's own fallback runs them on the host and copies "
               f"the results back")
    else:
        how = f"'{device_type}' has no fallback: a call to one fails as it does without cudashim"
    out(f"ops with a host kernel and none on '{device_type}' ({len(host_only)}; {how}):\n")
    out(textwrap.fill(", ".join(name.replace("aten::", "") for name in host_only), width=96,
                      initial_indent="  ", subsequent_indent="  ") + "\n")


def doctor(settings) -> int:
    import torch

    from . import activation, patches, torch_names, torch_range
    from .backends import cpu_speed

    out = sys.stdout.write
    out(f"cudashim {__version__}\n")
    out(f"python {platform.python_version()} on {platform.platform()}\n")
    out(f"torch {torch.__version__} (built with CUDA: {torch.version.cuda or 'no'}): "
        f"{torch_range.describe(torch.__version__)}\n")
    out("".join(f"{line}\n" for line in torch_names.describe_absent()))
    try:
        backends.load_devices(settings)
    except BackendUnavailableError as exc:
        out(f"devices asked for: {exc}\n")
    else:
        if settings.test_devices:
            out(f"test accelerator: {settings.test_devices} device(s) of type 'shimdev' loaded, "
                "collectives 'shimccl'\n")
        if settings.device_extension:
            out(f"device extensions: {', '.join(settings.device_extension)} imported\n")
    out("backends:\n")
    for name, state in backends.survey().items():
        out(f"  {name:6s} {state}\n")
    out("vendor packages:\n")
    for package in vendor_packages():
        out(f"  {package:30s} {'found' if module_found(package) else 'not installed'}\n")

    # Asked before activating: active, the import hook answers for the stand-ins.
    stand_ins = list(substitute_lines(settings, backends.resolve(settings.backend)[0].device_type))
    try:
        with activation.activated(settings=_without_report(settings)) as backend:
            reason = activation.current_activation().reason
            out(f"chosen backend: {backend.describe()}, {reason}\n")
            out(f"devices: {backend.device_count()} ({backend.get_device_name(None)})\n")
            try:
                became = backend.process_group_backend()
                how = " (through host memory to gloo: the device has no collective library)" \
                    if became == staged.NAME else ""
                out(f"collectives: NCCL becomes '{became}'{how}\n")
            except BackendUnavailableError as exc:
                out(f"collectives: none ({exc})\n")
            out("policies: " + ", ".join(
                f"{q}={'honest' if settings.is_honest(q) else 'compatible'}"
                for q in ("is_available", "is_cuda")) +
                f", unsupported APIs: {settings.unsupported}, report: {'on' if settings.report else 'off'}\n")
            out(f"the truth about CUDA goes to: {', '.join(callers.honest_set(settings.honest_for))}; "
                f"everyone else hears CUDA {heard_version(settings.cuda_version)}\n")
            out(f"the CUDA build they hear (--cuda-version): {build_line(settings.cuda_version, backend)}\n")
            out(f"{cpu_speed.describe_profile(settings.host_profile)}\n")
            precision = activation.current_activation().precision
            if precision is not None:
                out("precision:\n" + "".join(f"  {line}\n" for line in precision.describe()))
            stand_ins = [decided_line(line, sys.meta_path) for line in stand_ins]
            out("CUDA-only libraries (--substitute):\n" + "".join(f"  {line}\n" for line in stand_ins))
            out("frameworks with a device layer of their own:\n" + "".join(
                f"  {line}\n" for line in framework_lines(backend)))
            from .patches import triton as triton_kernels
            out(f"Triton kernels: {triton_kernels.describe(backend)}\n")
            out(f"hot wrappers: {speedups.describe(settings)}; host kernels: {host_kernels_line()}\n")
            out(f"{speedups.fast_path(settings)}\n")
            out("patch groups:\n")
            width = max(map(len, patches.names()))
            for name, off in patches.states(settings):
                out(f"  {name:{width}s} {'on' if off is None else 'off: ' + off}  ({patches.summary(name)})\n")
            if not backend.redirects:
                out("self-check: skipped (real CUDA, nothing is redirected)\n")
                return 0
            self_check()
    except Exception as exc:
        out(f"self-check: FAIL: {type(exc).__name__}: {exc}\n")
        traceback.print_exc(file=sys.stdout)
        return 1
    out("self-check: pass (tensors, .cuda(), autocast, GradScaler, events, backward, checkpoint)\n")
    return 0


def host_kernels_line() -> str:
    """Which compiled host kernels run, and which instruction-set variants this build has."""
    why_not = native.why_not_used()
    if why_not is not None:
        return why_not
    variants = ", ".join(v.name if v.runs_here else f"{v.name}: this CPU lacks {v.needs}"
                         for v in native.variants())
    return f"compiled (cudashim.kernels._native), the {native.variant()} variant (built: {variants})"


def substitute_lines(settings, device_type: str):
    """What an import of each CUDA-only library will get under these settings."""
    from .substitutes import LIBRARIES

    for name, library in LIBRARIES.items():
        if not settings.substitutes(name):
            state = "no stand-in (--substitute leaves it out)"
        elif module_found(library.modules[0]):
            state = (f"installed: imported first and tried on {device_type}; the stand-in serves "
                     f"if it fails")
        else:
            state = "not installed: the stand-in serves"
        yield f"{name:10s} {state}"


def framework_lines(backend):
    """What a GPU program's call into each framework gets on this backend (installed or not)."""
    from .patches import frameworks

    for framework, module in (("Lightning", "lightning"), ("Accelerate", "accelerate"), ("DeepSpeed", "deepspeed"),
                              ("Ray", "ray")):
        installed = "installed" if module_found(module) else "not installed"
        if not backend.redirects:
            yield f"{framework:10s} {installed}: native CUDA"
            continue
        runs, what = frameworks.what_it_gets(framework, frameworks.GPU_CHOICES.get(framework), backend.device_type,
                                             backend.deepspeed_accelerator)
        yield f"{framework:10s} {installed}: {what}" + ("" if runs else " (needs a change)")


def build_line(cuda_version: str, backend) -> str:
    """Every version answer of the CUDA build the program hears (cudashim.cuda_build)."""
    from .cuda_build import cuda_build

    build = cuda_build(cuda_version)
    major, minor = backend.get_device_capability(None)
    archs = build.with_architecture((major, minor))
    return (f"CUDA {build.cuda}, cuDNN {build.cudnn}, NCCL {'.'.join(map(str, build.nccl))}, "
            f"driver {build.driver} (CUDA {build.driver_cuda_version}), compute capability "
            f"{major}.{minor}, architectures {archs[0]}..{archs[-1]}")


def decided_line(line: str, meta_path) -> str:
    """A library's line, once activation has decided for it: a package imported before
    activation (torch imports pynvml) was tried then, and the finder knows the outcome."""
    from .substitutes.finder import SubstituteFinder

    name = line.split()[0]
    for finder in meta_path:
        if isinstance(finder, SubstituteFinder):
            if name in finder.served:
                return f"{name:10s} stand-in serves: {finder.served[name]}"
            if name in finder.kept:
                return f"{name:10s} the real package: {finder.kept[name]}"
    return line


def _without_report(settings):
    return settings._replace(report=False, report_json=None)   # doctor writes no report
