"""Every device parameter of torch's public API is classified, and the translated ones
work the way programs call them: on the CPU and on a fake accelerator."""

import importlib
import inspect
import os
import warnings

import pytest
import torch
import torch._utils

from conftest import free_port, install_fake

from cudashim.patches import GROUPS, group_module
from cudashim.patching import device_parameters
from cudashim.tables import device_parameters as parameter_tables


def test_every_device_parameter_in_torch_is_classified():
    tables = device_parameters.classification_tables()
    found = list(device_parameters.enumerate_parameters())
    unclassified = [f"{p.name}({p.parameter})" for p in found
                    if device_parameters.classify(p, tables) is None]
    assert unclassified == [], ("classify these in a patch group's REWRITES or TRANSLATES, or in "
                                f"cudashim/tables/device_parameters.py: {unclassified}")
    names = {(p.name, p.parameter) for p in found}
    # The enumeration reaches signatures, classes' methods and C++ operator schemas alike.
    assert {("torch.random.fork_rng", "devices"), ("torch.random.fork_rng", "device_type"),
            ("torch.distributed.distributed_c10d.init_process_group", "device_id"),
            ("torch.accelerator.synchronize", "device"), ("torch.zeros", "device"),
            ("torch.Tensor.to", "device"), ("torch.Generator", "device"),
            ("torch.nn.modules.Module.to_empty", "device")} <= names
    assert len(found) > 200


def test_takes_answers_as_the_parameters_torch_gives():
    """``takes`` stops reading at the first source that names the parameter: it must answer
    what the whole set does, for Python functions, C++ bindings and documented overloads."""
    from cudashim.patches.factories import constructors

    functions = [function for _, function in device_parameters._methods("torch.Tensor", torch.Tensor)]
    functions += [value for name, value in vars(torch).items()
                  if callable(value) and not name.startswith("_") and not isinstance(value, type)]
    functions += [getattr(owner, name) for owner, name in constructors()]
    asked = ("pin_memory", "device", "dtype", "non_blocking")
    differ = [(getattr(function, "__qualname__", function), parameter)
              for function in functions for parameter in asked
              if device_parameters.takes(function, parameter)
              != (parameter in (device_parameters.parameters_of(function) or ()))]
    assert differ == []
    assert device_parameters.takes(torch.zeros, "pin_memory")        # from its schema
    assert device_parameters.takes(torch.tensor, "pin_memory")       # from its docstring only
    assert not device_parameters.takes(torch.zeros, "non_blocking")


def test_signatures_are_inspects_own():
    """The shortcut for C functions answers as ``inspect.signature`` does, for torch's C
    bindings, method descriptors, slot wrappers, Python functions and classes alike."""
    from cudashim.patching.signatures import signature

    def inspects(function):
        try:
            return inspect.signature(function)
        except (TypeError, ValueError):
            return None

    functions = [value for value in vars(torch.Tensor).values()] + list(vars(torch).values())
    functions += [len, dict.get, object.__init__, (1).__add__, dict.fromkeys, torch.nn.Linear]
    differ = [function for function in functions if signature(function) != inspects(function)]
    assert differ == []
    assert signature(torch.zeros) is None and signature(len) is not None


def _declared_targets():
    for group in GROUPS:
        module = group_module(group)
        for declaration in getattr(module, "REWRITES", ()):
            for argument in declaration.arguments:
                yield group, declaration.target, argument.parameter
        for target, parameter in getattr(module, "TRANSLATES", ()):
            yield group, target, parameter


def test_every_entry_names_a_parameter_this_torch_has():
    """A stale entry (torch renamed or removed it) fails here, not silently. A C++ function
    torch documents no parameters for (``torch.is_autocast_enabled``) only has to exist."""
    entries = [(f"declared by {group}", target, parameter)
               for group, target, parameter in _declared_targets()]
    for kind, table in (("delegated", parameter_tables.DELEGATED_TO),
                        ("untouched", parameter_tables.UNTOUCHED_BECAUSE)):
        entries += [(kind, *device_parameters.split_entry(entry)) for entry in table]
    stale = []
    for where, target, parameter in entries:
        function = device_parameters.resolve(target)
        known = device_parameters.parameters_of(function) if function is not None else None
        if function is None or known is not None and parameter not in known:
            stale.append(f"{target}({parameter}) [{where}]")
    assert stale == []


def test_every_private_entry_point_libraries_call_is_as_listed():
    """A torch release that removes, renames or re-signs a private entry point fails here;
    one the table says is translated must be declared by a group."""
    declared = {(target, parameter) for _, target, parameter in _declared_targets()}
    changed = []
    for entry, listed in parameter_tables.PRIVATE_ENTRY_POINTS.items():
        target, parameter = device_parameters.split_entry(entry)
        function = device_parameters.resolve(target)
        if "only in CUDA builds" in listed.how:
            if (function is None) != (torch.version.cuda is None):
                changed.append(f"{entry}: present={function is not None}")
            continue
        if function is None:
            changed.append(f"{entry}: gone")
        elif listed.signature is not None and str(inspect.signature(function)) != listed.signature:
            changed.append(f"{entry}: now {inspect.signature(function)}")
        if listed.how.startswith("translated") and (target, parameter) not in declared:
            changed.append(f"{entry}: said to be translated, declared by no group")
    assert changed == []


def test_private_entry_points_answer_for_the_target_as_the_public_ones_do():
    import cudashim
    cudashim.activate("cpu", device_count=2)
    target = torch.zeros(1, device="cuda").device
    # bitsandbytes' Int8Params.to(0) and .to("cuda:1"), Lightning's mixin, accelerate's guard
    for args, kwargs in (((0,), {}), (("cuda:1",), {}), ((), {"device": "cuda"}),
                         ((torch.device("cuda", 0), torch.half), {})):
        assert torch._C._nn._parse_to(*args, **kwargs)[0] == target
    assert torch._C._nn._parse_to(torch.half)[:2] == (None, torch.half)
    for device in ("cuda:1", "cuda", torch.device("cuda", 1), 1):
        assert torch._utils._get_device_index(device, True) == torch.cuda._get_device_index(device, True)
    assert torch._utils._get_device_index("cuda:1") == 1
    cudashim.deactivate()
    assert torch._C._nn._parse_to("cpu")[0] == torch.device("cpu")


def test_every_parameter_an_install_translates_is_patched_while_active():
    """REWRITES are checked in test_patch_groups.py; TRANSLATES claim what install() does."""
    import cudashim
    originals = {}
    for group in GROUPS:
        for target, _ in getattr(group_module(group), "TRANSLATES", ()):
            importlib.import_module(target.partition(":")[0])
            originals[target] = device_parameters.resolve(target)
    assert "torch:Tensor.cuda" in originals
    cudashim.activate("cpu")
    try:
        unpatched = [target for target, original in originals.items()
                     if device_parameters.resolve(target) is original]
    finally:
        cudashim.deactivate()
    assert unpatched == []
    assert all(device_parameters.resolve(target) is original for target, original in originals.items())


# --- the way programs call them --------------------------------------------------------
def _one_rank_group(**kwargs):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    dist.init_process_group("nccl", rank=0, world_size=1, **kwargs)
    return dist


def eager_init_with_a_cuda_device_id(target):
    # DeepSpeed's and torchtitan's eager init.
    dist = _one_rank_group(device_id=torch.device("cuda", 0))
    try:
        sub = dist.new_group([0], device_id=torch.device("cuda", 0))
        t = torch.ones(2, device="cuda")
        dist.all_reduce(t, group=sub)
        objects = [{"step": 3}]
        dist.broadcast_object_list(objects, src=0, device=torch.device("cuda"))
        return t.device, objects == [{"step": 3}] and dist.get_backend() == "nccl"
    finally:
        dist.destroy_process_group()


def fork_rng_over_cuda_devices(target):
    before = torch.randn(3, device="cuda")
    with torch.random.fork_rng(devices=[0]):
        torch.randn(5, device="cuda")
    with torch.random.fork_rng(devices=[0], device_type="cuda"):
        torch.randn(5)
    # torch's own fallback to "cuda" (no accelerator found) asks get_device_module itself.
    with torch.random.fork_rng(devices=[0], device_type=None):
        torch.randn(5)
    torch.manual_seed(0)
    with torch.random.fork_rng(devices=[0]):
        torch.randn(5, device="cuda")
    forked = torch.randn(2, device="cuda")
    torch.manual_seed(0)
    return before.device, torch.equal(forked, torch.randn(2, device="cuda"))


def accelerator_calls_naming_cuda(target):
    torch.accelerator.set_device_index("cuda:0")
    stream = torch.accelerator.current_stream("cuda")
    with torch.accelerator.device_index(0):
        index = torch.cuda.current_device()
    return stream.device, index == 0


def flex_attention_block_mask_on_cuda_by_default(target):
    from torch.nn.attention.flex_attention import create_block_mask
    mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 128, 128)
    moved = mask.to("cuda")
    return mask.kv_num_blocks.device, moved.kv_num_blocks.device == mask.kv_num_blocks.device


def tensors_from_other_doors(target):
    nested = torch.nested.as_nested_tensor([torch.ones(2), torch.ones(3)], device="cuda")
    shared = torch.utils.dlpack.from_dlpack(torch.arange(3), device="cuda")
    return nested.device, shared.device == nested.device


def checkpoint_default_device_type(target):
    from torch.utils.checkpoint import DefaultDeviceType
    DefaultDeviceType.set_device_type("cuda")
    return torch.device(DefaultDeviceType.get_device_type()), True


def sharded_grad_scaler_with_cuda_default(target):
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
    return torch.device(ShardedGradScaler()._device), True


def modules_and_helpers_that_delegate(target):
    from torch.optim.swa_utils import AveragedModel, update_bn
    linear = torch.nn.Linear(4, 4, device="cuda")
    mask = torch.nn.Transformer.generate_square_subsequent_mask(4, device="cuda")
    window = torch.signal.windows.hann(8, device="cuda")
    averaged = AveragedModel(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2)),
                             device="cuda")
    update_bn([torch.ones(4, 2, device="cuda")], averaged, device="cuda")
    devices = {linear.weight.device, mask.device, window.device, next(averaged.parameters()).device}
    return linear.weight.device, len(devices) == 1


def lazy_modules_materialize_on_cuda(target):
    lazy = torch.nn.LazyLinear(2, device="cuda")
    out = lazy(torch.ones(1, 3, device="cuda"))
    return lazy.weight.device, out.device == lazy.weight.device


def saved_state_from_a_url(target, tmp_path):
    path = tmp_path / "weights.pt"
    torch.save({"w": torch.ones(2)}, path)
    state = torch.hub.load_state_dict_from_url(f"file://{path}", model_dir=str(tmp_path / "hub"),
                                               map_location="cuda")
    return state["w"].device, True


PROGRAMS = [eager_init_with_a_cuda_device_id, fork_rng_over_cuda_devices,
            accelerator_calls_naming_cuda, flex_attention_block_mask_on_cuda_by_default,
            tensors_from_other_doors, checkpoint_default_device_type,
            sharded_grad_scaler_with_cuda_default, modules_and_helpers_that_delegate,
            lazy_modules_materialize_on_cuda, saved_state_from_a_url]
# What the fake accelerator itself cannot do (its limits, not cudashim's): its tensors are
# wrapper subclasses, which UninitializedParameter cannot subclass again, and torch.load
# leaves its storages on the CPU (with map_location="npu" too).
FAKE_CANNOT = {lazy_modules_materialize_on_cuda, saved_state_from_a_url}


@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
@pytest.mark.parametrize("backend", ["cpu", "npu"])
def test_device_parameters_the_way_programs_pass_them(backend, program, tmp_path):
    if backend != "cpu" and program in FAKE_CANNOT:
        pytest.skip("the fake accelerator cannot do this itself")
    install_fake(backend)
    import cudashim
    cudashim.activate(backend)
    try:
        args = (backend, tmp_path) if "tmp_path" in inspect.signature(program).parameters else (backend,)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            device, consistent = program(*args)
    finally:
        cudashim.deactivate()
    assert device.type == backend
    assert consistent


def test_host_memory_vocabulary_on_the_cpu(shim, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # TypedStorage is deprecated
        made = torch.TypedStorage(4, device="cuda")
        moved = torch.TypedStorage(4).to(device="cuda")
        pinned = torch.TypedStorage(4).pin_memory()        # device="cuda" by default
        checked = torch.TypedStorage(4).is_pinned()
    mapped = torch.from_file(str(tmp_path / "data.bin"), shared=True, size=4, device="cuda")
    assert {made.device.type, moved.device.type, pinned.device.type, mapped.device.type} == {"cpu"}
    assert checked is False
    # Pinning returns a copy that says it is pinned, as CUDA's does (a move from it copies again)
    assert torch.ones(2).pin_memory("cuda").is_pinned("cuda") is True
    # Pinned staging buffers made by a factory: host memory is where the CPU computes, and torch
    # refuses to pin it without an accelerator; made unpinned, they say they are pinned, as a
    # pinned copy does, and a move from one copies.
    staging = torch.empty(4, pin_memory=True)
    batch = torch.zeros(2, 3, device="cuda", pin_memory=True)
    assert staging.is_pinned() and not torch.empty(4).is_pinned()
    assert not batch.is_pinned() and batch.device.type == "cpu"       # device memory is not pinned
    assert staging.cpu() is staging and staging.to("cuda", non_blocking=True) is not staging
    # and so are a tensor's own constructors (torch alone raises: no pinned memory allocator)
    assert staging.new_zeros(3, pin_memory=True).tolist() == [0, 0, 0]
    assert staging.new_zeros(3, pin_memory=True).is_pinned()
    assert staging.new_full((2,), 7.0, pin_memory=True, device="cuda").tolist() == [7, 7]


# --- comparisons against classes cudashim stands in for --------------------------------
# While active, torch.device and torch.Generator are stand-ins: ``isinstance`` works, but
# ``x.__class__ is torch.device`` never holds and ``type(x) == torch.device`` never matches.
# cudashim's own code compares with the real classes it captured at import.
STOOD_IN = {"torch.device", "torch.Generator"}


def _dotted(node):
    import ast
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return node.id if isinstance(node, ast.Name) else None


def _class_comparisons(tree):
    import ast
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _dotted(node.func) in ("isinstance", "issubclass") \
                and len(node.args) == 2:
            classes = node.args[1].elts if isinstance(node.args[1], ast.Tuple) else [node.args[1]]
            yield from (node for c in classes if _dotted(c) in STOOD_IN)
        elif isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(_dotted(o) in STOOD_IN for o in operands) and \
                    any(isinstance(op, (ast.Is, ast.IsNot, ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                        for op in node.ops):
                yield node
        elif isinstance(node, (ast.Tuple, ast.Set, ast.List)) and \
                any(_dotted(e) in STOOD_IN for e in node.elts):
            yield node                               # a class table used for membership


def test_cudashim_never_compares_with_a_class_it_stands_in_for():
    import ast
    from conftest import ROOT
    found = []
    for path in sorted((ROOT / "cudashim").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        found += [f"{path.relative_to(ROOT)}:{node.lineno}" for node in _class_comparisons(tree)]
    assert found == [], "compare with the real class (torch._C.device, captured at import)"
    # The check itself finds the kind of comparison that broke device_id.
    sample = ast.parse("ok = isinstance(d, torch.device) or d.__class__ is torch.Generator\n"
                       "kinds = (str, int, torch.device)\n")
    assert len(list(_class_comparisons(sample))) == 3
