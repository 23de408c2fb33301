"""The torch names cudashim reads that not every torch it supports has, and what it does without them.

torch's private names (``torch._C`` bindings, dynamo's and inductor's internals, ``torch.utils._*``)
move between releases, and public ones arrive later than the oldest torch cudashim supports
(``torch.accelerator`` came with 2.6). Every such name cudashim reads is an entry of ``NAMES``,
and each entry says what happens where the running torch lacks it:

- ``FALLBACK``: cudashim does without it, in the way the entry describes (``get`` returns the
  default its reader gives);
- ``TURNS_OFF``: the patch group that reads it stays off, with one warning naming the torch
  version and the name (``patches.off_reason``), as a group outside its ``SUPPORTED_TORCH`` does;
- ``REQUIRED``: present in every release CI tests (``torch_range.TESTED``); a torch without it is
  a release cudashim does not support yet, which the torch-range set finds
  (``./scripts/tox -e torch-newest``) before a user does.

``tests/test_torch_names.py`` builds this table for the installed torch, fails on a name the
source reads that is missing here and on an absent ``REQUIRED`` one; CI runs it on every torch
of the range. This module imports torch only when a name is looked up.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

FALLBACK, TURNS_OFF, REQUIRED = "fallback", "turns off", "required"
_MISSING = object()


class Name(NamedTuple):
    path: str           # "torch.backends.mkldnn.matmul.fp32_precision": modules, then attributes
    reader: str         # the patch group (or the part) that reads it
    absent: str         # FALLBACK, TURNS_OFF or REQUIRED
    without: str = ""   # what cudashim does without it (FALLBACK), or why it is required


def _n(path, reader, absent, without=""):
    return Name(path, reader, absent, without)


# Where a name's module is imported only when the program uses it (dynamo, inductor), its
# absence is found then: the patch made on that import is left out, with one warning
# (``Activation.when_imported``).
NAMES: Dict[str, Name] = {name.path: name for name in (
    # --- public names newer than torch 2.4 ---------------------------------------------------
    _n("torch.accelerator", "torch_accelerator", FALLBACK,
       "nothing to patch: torch.accelerator came with 2.6, and no program calls it before"),
    _n("torch.accelerator.current_accelerator", "backends.accelerator", FALLBACK,
       "the out-of-tree device a vendor's extension registered: PrivateUse1's name, where a "
       "device module of that name exists"),
    _n("torch.backends.mkldnn.matmul.fp32_precision", "precision", FALLBACK,
       "the TF32 flags are not mapped to oneDNN's reduced-precision matmuls: float32 stays "
       "float32, as on a GPU without TF32"),
    _n("torch.distributed.tensor.DTensor", "distributed", FALLBACK,
       "attention on DTensors is left to torch, which shards only CUDA's attention kernels: "
       "tensor-parallel attention on DTensors fails on the target, as it would natively"),
    _n("torch.distributed.tensor.Replicate", "distributed", FALLBACK,
       "as without torch.distributed.tensor.DTensor"),
    _n("torch.distributed.tensor.Shard", "distributed", FALLBACK,
       "as without torch.distributed.tensor.DTensor"),
    _n("torch.distributed.tensor.DTensor._op_dispatcher._custom_op_handlers", "distributed", FALLBACK,
       "context parallelism's ring attention is not reached: attention on a sharded sequence is "
       "gathered and computed whole, and a program under context_parallel gets the whole "
       "sequence's output where it expects its part (every torch with context parallelism has it)"),
    # --- private names --------------------------------------------------------------------
    _n("torch._C._get_graph_executor_optimize", "torchscript", FALLBACK,
       "scripted code keeps TorchScript's optimizations on the target, and a scripted model "
       "trained under its autocast may fail in backward, as it does natively on such a device"),
    _n("torch._C._set_graph_executor_optimize", "torchscript", FALLBACK,
       "as torch._C._get_graph_executor_optimize"),
    _n("torch._jit_internal._try_get_dispatched_fn", "torchscript", FALLBACK,
       "TorchScript meets torch's Python functions that a group replaced as they are: scripted "
       "code calling one (nn.GroupNorm's F.group_norm where float16 is widened) fails to compile"),
    _n("torch._native_multi_head_attention", "precision", FALLBACK,
       "nn.MultiheadAttention's fused inference path keeps float16 as asked where float16 is "
       "slow (its projections at float16's speed); its other path is computed by the policy"),
    *(_n(f"torch.ops.mkldnn.{name}", "precision", FALLBACK,
         "float16 linear layers computed in bfloat16 keep their copies in torch's layout, which "
         "oneDNN reorders at every call, as in a bfloat16 port")
      for name in ("_reorder_linear_weight", "_linear_pointwise", "_is_mkldnn_bf16_supported")),
    *(_n(path, "precision", FALLBACK,
         "float16 conv1d and conv2d layers computed in bfloat16 keep a plain copy of their weight, which "
         "oneDNN reorders at every call, and their activations are converted and permuted in "
         "torch's two passes each way, as in a bfloat16 port")
      for path in ("torch._C._nn.mkldnn_reorder_conv2d_weight", "torch.ops.mkldnn._convolution_pointwise")),
    _n("torch._C._nn.mkldnn_reorder_conv3d_weight", "precision", FALLBACK,
       "float16 conv3d layers computed in bfloat16 keep a plain copy of their weight, which oneDNN "
       "reorders at every call, and their activations are converted and permuted in torch's two "
       "passes each way, as in a bfloat16 port"),
    *(_n(path, "precision", FALLBACK,
         "float16 conv_transpose1d, conv_transpose2d and conv_transpose3d layers computed in bfloat16 "
         "keep a plain copy of their weight, which oneDNN reorders at every call, and their "
         "activations are converted and permuted in torch's two passes each way, as in a bfloat16 port")
      for path in ("torch.ops.mkldnn._reorder_convolution_transpose_weight",
                   "torch.ops.mkldnn._convolution_transpose_pointwise")),
    _n("torch._VF", "precision", FALLBACK,
       "nn.LSTM, nn.GRU, nn.RNN and their cells keep float16 as asked where float16 is slow "
       "(their products at float16's speed)"),
    _n("torch._transformer_encoder_layer_fwd", "precision", FALLBACK,
       "as torch._native_multi_head_attention, for nn.TransformerEncoderLayer's fused path"),
    *(_n(path, "precision", FALLBACK,
         "a padded batch that nn.TransformerEncoder hands its float16 layers as a nested tensor is "
         "computed by torch's fused layer on plain bfloat16 copies, as in a bfloat16 port; a dense "
         "batch is computed op by op on packed weights all the same")
      for path in ("torch._nested_view_from_buffer", "torch.Tensor._nested_tensor_size",
                   "torch.Tensor._nested_tensor_strides", "torch.Tensor._nested_tensor_storage_offsets")),
    _n("torch._foreach_norm", "reductions", FALLBACK,
       "nothing to patch: a torch without foreach norms takes each gradient's norm in "
       "clip_grad_norm_ with torch.linalg.vector_norm, which is patched"),
    # torch.compile (patches/compiled.py), read when dynamo or inductor is imported
    _n("torch._dynamo.variables.base.VariableTracker.build", "compiled", FALLBACK,
       "ConstantVariable.create, which torch before 2.6 makes dynamo's constants with"),
    _n("torch._dynamo.variables.constant.ConstantVariable.create", "compiled", REQUIRED,
       "the fallback of VariableTracker.build"),
    _n("torch._dynamo.variables.tensor.TensorVariable.method_attr_is_cuda", "compiled", REQUIRED,
       "what dynamo answers for is_cuda while it traces"),
    _n("torch._dynamo.variables.builder.VariableBuilder._wrap", "compiled", REQUIRED,
       "where dynamo meets the compiled wrappers"),
    _n("torch._dynamo.trace_rules.get_tensor_method", "compiled", FALLBACK,
       "torch's own method for one cudashim replaced, handed to a torch function mode in "
       "compiled code, is a graph break"),
    _n("torch._dynamo.variables.builder.SourcelessBuilder", "compiled", FALLBACK,
       "a wrapper handed to a torch function mode in compiled code (set_default_device's, a "
       "program's own) is a graph break, or traces the precision policy's buffers"),
    _n("torch._dynamo.variables.builder.VariableBuilder.install_guards", "compiled", REQUIRED, "guards"),
    _n("torch._dynamo.variables.builder.VariableBuilder.get_source", "compiled", REQUIRED, "guards"),
    *(_n(f"torch._dynamo.variables.torch.{table}", "compiled", FALLBACK,
         "a wrapper's own call of torch's function that dynamo folds to its value "
         "(torch.is_autocast_enabled), met where dynamo traces the wrapper, is a graph break")
      for table in ("constant_fold_functions", "constant_fold_functions_need_guards")),
    _n("torch._dynamo.trace_rules.get_torch_obj_rule_map", "compiled", REQUIRED,
       "torch's table of its own functions, which names the wrappers"),
    _n("torch._dynamo.guards.GuardBuilder.ID_MATCH", "compiled", REQUIRED, "guards"),
    _n("torch._dynamo.guards.GuardBuilder.TYPE_MATCH", "compiled", REQUIRED, "guards"),
    _n("torch._dynamo.source.AttrSource", "compiled", REQUIRED, "the twin's source"),
    _n("torch._inductor.compile_fx.compile_fx", "compiled", REQUIRED,
       "where a graph on a device without a code generator goes to AOTAutograd's eager backend"),
    _n("torch._inductor.codegen.common.get_scheduling_for_device", "compiled", REQUIRED,
       "whether inductor has a code generator for the device"),
    _n("torch._inductor.codegen.common.init_backend_registration", "compiled", FALLBACK,
       "nothing: torch 2.4 registers inductor's code generators as it compiles (a vendor's "
       "may then be found only after its first graph, which runs in AOTAutograd's eager backend)"),
    _n("torch._dynamo.backends.debugging.aot_eager", "compiled", REQUIRED,
       "the backend for devices inductor has no code generator for"),
    _n("torch._streambase._StreamBase", "backends.host", FALLBACK,
       "an ABC before torch 2.5, which dynamo checks streams against; later an alias of torch.Stream, or absent: nothing to register with"),
    _n("torch._streambase._EventBase", "backends.host", FALLBACK,
       "an ABC before torch 2.5, which dynamo checks events against; later an alias of torch.Event, or absent: nothing to register with"),
    _n("torch._dynamo.eval_frame.skip_code", "residency", FALLBACK,
       "dynamo compiles the device-memory count's frame under a compiled function's eager parts, "
       "once per op, up to its recompile limit, with its warning"),
    _n("torch.utils._device.DeviceContext", "residency", FALLBACK,
       "a tensor made under `with torch.device(\"cuda\")` or set_default_device(\"cuda\") on the "
       "CPU backend is not counted as device memory, and its side is not known"),
    # read directly, present in every release CI tests: a release without one is found by the
    # torch-range set (tests/test_torch_names.py) before a user meets it
    *(_n(path, reader, REQUIRED, why) for path, reader, why in (
        ("torch._C.device", "translation", "the C type torch.device wraps: the fast isinstance checks"),
        ("torch._C.Generator", "patching.device_parameters", "the C type torch.Generator wraps"),
        ("torch._C.StorageBase", "patching.device_parameters", "storages' methods take devices"),
        ("torch._C.TensorBase.to", "tensors", "the unpatched Tensor.to"),
        ("torch._C.TensorBase.cpu", "tensors", "the unpatched Tensor.cpu"),
        ("torch._C.DispatchKey.ADInplaceOrView", "graphs.replay", "replay below autograd"),
        ("torch._C.DispatchKey.PrivateUse1", "kernel_gaps", "a device's own kernels"),
        ("torch._C._ExcludeDispatchKeyGuard", "graphs.replay", "replay below autograd"),
        ("torch._C._dispatch_keyset_full", "graphs.replay", "replay below autograd"),
        ("torch._C._dispatch_keyset_full_after", "graphs.replay", "replay below autograd"),
        ("torch._C._dispatch_get_all_op_names", "kernel_gaps", "the ops a device lacks"),
        ("torch._C._dispatch_has_kernel_for_dispatch_key", "kernel_gaps", "the ops a device lacks"),
        ("torch._C._dispatch_has_backend_fallback", "doctor", "whether a device runs the rest on the host"),
        ("torch._C._distributed_c10d.ProcessGroupGloo", "backends.staged", "collectives through host memory"),
        ("torch._C._distributed_c10d._create_work_from_future", "backends.staged",
         "collectives through host memory"),
        ("torch._C._get_privateuse1_backend_name", "testdevice", "out-of-tree devices' name"),
        ("torch._C._jit_get_all_schemas", "patching.device_parameters", "every op's device parameters"),
        ("torch._C._jit_get_schemas_for_operator", "patching.device_parameters", "an op's device parameters"),
        ("torch._C._jit_get_emit_hooks", "torchscript", "TorchScript's compile hooks"),
        ("torch._C._jit_set_emit_hooks", "torchscript", "TorchScript's compile hooks"),
        ("torch._C._jit_pass_inline", "graphs", "reading a scripted graph"),
        ("torch._C._ImperativeEngine", "autograd_exit", "a backward that stashes no Python state"),
        ("torch._C._len_torch_function_stack", "autograd_exit", "setting the function modes aside"),
        ("torch._C._pop_torch_function_stack", "autograd_exit", "setting the function modes aside"),
        ("torch._C._push_on_torch_function_stack", "autograd_exit", "setting the function modes aside"),
        ("torch._C._nn.linear", "cpu_speed", "the matmul speed probe, below the precision patches"),
        ("torch._C._nn.scaled_dot_product_attention", "cpu_speed",
         "the attention speed probe, below the precision patches"),
        ("torch._amp_foreach_non_finite_check_and_unscale_", "substitutes.apex", "apex's unscale"),
        ("torch._ops.OpOverload", "graphs", "recording ops"),
        ("torch._register_device_module", "testdevice", "registering the test accelerator's module"),
        ("torch._utils.ExceptionWrapper", "parallel", "a worker's exception, re-raised"),
        ("torch._utils._flatten_dense_tensors", "parallel.comm", "torch.cuda.comm's buckets"),
        ("torch._utils._unflatten_dense_tensors", "parallel.comm", "torch.cuda.comm's buckets"),
        ("torch._utils._handle_complex", "parallel.comm", "torch.cuda.comm's buckets"),
        ("torch._utils._reorder_tensors_as", "parallel.comm", "torch.cuda.comm's buckets"),
        ("torch._utils._take_tensors", "parallel.comm", "torch.cuda.comm's buckets"),
        ("torch.distributed.distributed_c10d._get_default_group", "distributed", "the default group"),
        ("torch.jit._builtins._get_builtin_table", "torchscript", "TorchScript's builtin table"),
        ("torch.jit._serialization.load", "torchscript", "torch.jit.load's map_location"),
        ("torch.mps._get_default_mps_generator", "backends.mps", "MPS's generator"),
        ("torch.nn.modules._functions.SyncBatchNorm.apply", "distributed", "SyncBatchNorm on the host"),
        ("torch.serialization._package_registry", "serialization", "map_location's device tags"),
        ("torch.utils._device._device_constructors", "factories", "every factory that takes device="),
        ("torch.utils._foreach_utils._get_fused_kernels_supported_devices", "substitutes.apex",
         "whether fused optimizers run on the device"),
        ("torch.utils._python_dispatch.TorchDispatchMode", "graphs", "recording a CUDA graph"),
        ("torch.utils._python_dispatch._get_current_dispatch_mode_stack", "graphs", "recording"),
        ("torch.utils._pytree.tree_leaves", "graphs", "a graph's inputs"),
        ("torch.utils._pytree.tree_flatten", "graphs", "a graph's inputs"),
        ("torch.utils._pytree.tree_unflatten", "graphs", "a graph's outputs"),
        ("torch.utils._pytree.arg_tree_leaves", "graphs", "a graph's inputs"),
        ("torch.utils._pytree.tree_map", "layouts", "an op's arguments read to the host"),
        ("torch.Tensor._make_wrapper_subclass", "layouts", "a sparse tensor of the device held on the host"),
        ("torch._utils._rebuild_sparse_tensor", "layouts", "a held sparse tensor saved as CUDA saves one"),
        ("torch._nested_tensor_from_mask", "layouts", "where TransformerEncoder's nested path begins"),
        ("torch._C.DispatchKeySet", "layouts", "torch's host kernels for a compressed tensor's parts"),
        ("torch._C.DispatchKey.SparseCsrCPU", "layouts", "torch's host kernels for a compressed tensor's parts"),
        ("torch.ops.aten._sparse_compressed_tensor_unsafe", "layouts", "a compressed tensor made from its parts"),
        ("torch.ops.aten._sparse_compressed_tensor_unsafe.default", "layouts",
         "a compressed tensor made from its parts"),
        ("torch.ops.aten._scaled_dot_product_flash_attention.default", "distributed",
         "context parallelism's ring attention, which runs CUDA's attention ops"),
        ("torch.ops.aten._scaled_dot_product_efficient_attention", "distributed",
         "context parallelism's ring attention, which runs CUDA's attention ops"),
    )),
    _n("torch._C._cuda_init", "cuda_module", FALLBACK,
       "nothing to do: a torch built without CUDA never starts it, so never sets names on torch.cuda"),
    _n("torch._C._is_key_in_tls", "autograd_exit", FALLBACK,
       "nothing to set aside: a torch without it stashes no Python state for its backward threads"),
    _n("torch._C._remove_obj_from_tls", "autograd_exit", FALLBACK,
       "the stashed contextvars stay in the exit's backward, whose device thread then frees them"),
    _n("torch._C._is_torch_function_mode_enabled", "residency", FALLBACK,
       "a move of a tensor to where it was placed asks torch's move first (+0.1 to +0.2 µs a call)"),
    _n("torch._C._is_tracing", "residency", FALLBACK,
       "as without _is_torch_function_mode_enabled: a move to where a tensor is asks torch's move"),
    _n("torch.utils.data.dataloader._BaseDataLoaderIter", "data", FALLBACK,
       "DataLoader(pin_memory=True) pins nothing where device memory is host memory: a batch is the "
       "memory the dataset or collate returned, not a pinned copy"),
    _n("torch.utils.data._utils.pin_memory.pin_memory", "data", FALLBACK,
       "as without _BaseDataLoaderIter: DataLoader batches are not pinned copies on the CPU backend"),
    _n("torch.distributed.tensor._random.OffsetBasedRNGTracker", "distributed", FALLBACK,
       "DTensor's random ops keep torch's own tracker, which refuses a generator without offsets "
       "(the host's, the test accelerator's)"),
    _n("torch.distributed._tensor.random.OffsetBasedRNGTracker", "distributed", FALLBACK,
       "as without torch.distributed.tensor._random.OffsetBasedRNGTracker (torch before 2.5)"),
    _n("torch.distributed._tensor.DTensor", "distributed", FALLBACK,
       "as without torch.distributed.tensor.DTensor (torch 2.4 has only this name)"),
    _n("torch.distributed._tensor.Replicate", "distributed", FALLBACK,
       "as without torch.distributed._tensor.DTensor"),
    _n("torch.distributed._tensor.Shard", "distributed", FALLBACK,
       "as without torch.distributed._tensor.DTensor"),
    _n("torch.distributed._tensor.DTensor._op_dispatcher._custom_op_handlers", "distributed", FALLBACK,
       "as without torch.distributed.tensor.DTensor._op_dispatcher._custom_op_handlers"),
    _n("torch.distributed._functional_collectives", "distributed", REQUIRED,
       "DTensor's all-to-all on torch before 2.7 over staged collectives is its all-gather; "
       "the module is DTensor's own collectives in every torch CI tests"),
    _n("torch.cpu._is_amx_fp16_supported", "cpu_speed", FALLBACK,
       "the CPU's amx_fp16 flag in /proc/cpuinfo"),
    _n("torch.cpu._is_avx512_bf16_supported", "cpu_speed", FALLBACK,
       "the CPU's avx512_bf16 flag in /proc/cpuinfo"),
    _n("torch.cpu._is_amx_tile_supported", "cpu_speed", FALLBACK,
       "the CPU's amx_tile flag in /proc/cpuinfo"),
)}


class TorchLacks(AttributeError):
    """The running torch has no ``name``."""

    def __init__(self, name: str):
        import torch
        super().__init__(f"torch {torch.__version__} has no {name}")
        self.name = name


def lacked_by_torch(error: BaseException) -> Optional[str]:
    """The torch name ``error`` says the running torch lacks, or None where it says something
    else: a ``TorchLacks``, an ``AttributeError`` raised on a torch module or class, an
    ``ImportError`` of a torch module. What cudashim read directly (a ``REQUIRED`` name) and a
    newer release removed is then told apart from a bug of cudashim's own."""
    if isinstance(error, TorchLacks):
        return error.name
    if isinstance(error, ImportError) and (error.name or "").split(".")[0] == "torch":
        return error.name
    if isinstance(error, AttributeError) and getattr(error, "name", None):
        owner = getattr(error, "obj", None)
        where = getattr(owner, "__name__", "") if isinstance(owner, type(sys)) \
            else getattr(owner, "__module__", "") or getattr(type(owner), "__module__", "")
        if isinstance(where, str) and where.split(".")[0] == "torch":
            return f"{getattr(owner, '__name__', where)}.{error.name}"
    return None


def entry(path: str) -> Name:
    try:
        return NAMES[path]
    except KeyError:
        raise KeyError(f"{path} is not in cudashim.torch_names.NAMES: add it, with what happens "
                       "where a torch lacks it") from None


def get(path: str, default: Any = _MISSING, *, import_modules: bool = True) -> Any:
    """The object at ``path`` in the running torch. Where it lacks one: ``default`` if given,
    else ``TorchLacks``. ``import_modules=False`` looks only in modules already imported."""
    entry(path)
    found = _resolve(path, import_modules)
    if found is _MISSING:
        if default is _MISSING:
            raise TorchLacks(path)
        return default
    return found


def has(path: str, *, import_modules: bool = True) -> bool:
    entry(path)
    return _resolve(path, import_modules) is not _MISSING


def _resolve(path: str, import_modules: bool) -> Any:
    """The object at ``path``, or _MISSING. The longest prefix already imported is tried first,
    so that a name found there costs no import attempt; then, where allowed, modules are
    imported (a module that fails on import is as good as absent)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            value = _attributes(module, parts[cut:])
            if value is not _MISSING or not import_modules:
                return value
            break
    if not import_modules:
        return _MISSING
    for cut in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:cut]))
        except Exception:
            continue
        return _attributes(module, parts[cut:])
    return _MISSING


def _attributes(value: Any, attributes: List[str]) -> Any:
    for attribute in attributes:
        try:
            value = getattr(value, attribute)
        except Exception:              # AttributeError, or a lazy module's own error
            return _MISSING
    return value


def turned_off(group: str) -> Optional[Tuple[str, str]]:
    """(name, why) for the first name that group ``group`` cannot do without and this torch
    lacks, else None."""
    for name in NAMES.values():
        if name.reader == group and name.absent == TURNS_OFF and _resolve(name.path, True) is _MISSING:
            return name.path, name.without
    return None


# Modules torch imports only when a program uses them (each costs a second or more).
LAZY_MODULES = ("torch._dynamo", "torch._inductor", "torch.utils.cpp_extension")


def table(import_modules: bool = True) -> List[Tuple[Name, Optional[bool]]]:
    """[(entry, whether the running torch has it)], every entry. ``import_modules=False``
    leaves ``LAZY_MODULES`` unimported: an entry in one not imported yet is None."""
    rows: List[Tuple[Name, Optional[bool]]] = []
    for name in NAMES.values():
        lazy = next((module for module in LAZY_MODULES if name.path.startswith(module + ".")), None)
        if not import_modules and lazy is not None and lazy not in sys.modules:
            rows.append((name, None))
        else:
            rows.append((name, _resolve(name.path, True) is not _MISSING))
    return rows


def describe_absent() -> List[str]:
    """What ``cudashim doctor`` prints: each name this torch lacks and what cudashim does
    instead (dynamo's and inductor's are checked when a program imports them)."""
    rows = table(import_modules=False)
    absent = [name for name, present in rows if present is False]
    checked = sum(1 for _, present in rows if present is not None)
    lines = [f"torch's private and newer names cudashim reads: {len(rows)}, {checked} checked now "
             f"(dynamo's, inductor's and the extension builder's when a program imports them), {len(absent)} absent here"]
    lines += [f"  {name.path}: {name.absent}: {name.without}" for name in absent]
    return lines
