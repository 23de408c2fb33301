"""Moves between host and device are copies where device memory is host memory (the CPU backend).

The moves a program makes by name are patched here, beneath the device translation the
``tensors``, ``factories`` and ``modules`` groups put on top of them: those hand these functions
the target's device, which on the CPU backend is one device object (``backend.target_device``),
so a move to it is a move to the device. ``cudashim.residency`` decides what each returns.
``Tensor.cuda`` and pinning, which the ``tensors`` group patches, read ``activation.residency``.

``Tensor.device`` tells the two sides apart where torch cannot: a tensor known to be on the device
answers the target's device object, one known to be on the host the program's ``torch.device("cpu")``,
so a move to a device read off a tensor (``batch.to(model.device)``, ``x.to(weights.device)``) is
a move to that side. The same value either way (a host device), so only the moves see the
difference. A tensor of unknown side (an op's result) answers torch's own device object, and a
move to it keeps torch's answer.
"""

import functools

import torch

from .. import torch_names
from ..patching.rewriter import compiled_twin
from ..residency import DEVICE, HOST, PINNED, Residency, plain_dense


def destination(backend, translator):
    """``spec -> side``: DEVICE, HOST, or None where the spec does not say."""
    device_object = backend.target_device(None)
    named, real_device = translator.named, torch._C.device

    def side_of_spec(spec, residency):
        if spec is device_object:
            return DEVICE
        cls = spec.__class__
        if cls is str:
            return HOST if spec == "cpu" or spec.startswith("cpu:") else None
        if cls is real_device:
            return HOST if spec is named.get("cpu") else None
        if isinstance(spec, torch.Tensor):         # to(other): where the other tensor is
            side = residency.side_of(spec)
            return HOST if side is not None and residency.is_host(spec) else side
        return None

    return side_of_spec


def install(activation):
    backend = activation.backend
    if not getattr(backend, "device_memory_is_host", False) or activation.translator is None:
        return
    memory = getattr(backend, "device_memory", None)
    if memory is not None and activation.compiled is not None:
        memory = backend.device_memory = activation.compiled.DeviceMemory()
    residency = Residency(activation.count if activation.reporting else None, memory)
    activation.residency = residency
    host_device = activation.translator.host_device()
    _install_device_reading(activation, residency, host_device)
    if memory is not None:
        # A constructor's tensor made on the device (``torch.zeros(n, device="cuda")``) is device
        # memory: counted, and so on the device for the moves (``Residency.side_of``); so is one
        # made like a tensor whose storage is counted (``torch.zeros_like(weight)``): every
        # tensor a move or a constructor put on the device is.
        activation.placing = (backend.target_device(None), memory.add, memory)
    if not backend.can_pin_memory():
        # torch.empty(n, pin_memory=True): host memory is the target's, so the tensor is made
        # unpinned (torch refuses to pin without an accelerator) and known as pinned, as
        # Tensor.pin_memory()'s copies are: is_pinned() says so, and moves copy it as CUDA does.
        def pinned(tensor):
            if residency.side_of(tensor) != DEVICE:       # device="cuda", pin_memory=True: the device's
                residency.place(tensor, PINNED)
        activation.pinning = pinned
    side_of_spec = destination(backend, activation.translator)
    moved = residency.moved
    stay = compiled_stay(activation, residency)

    def make_to(original):
        @functools.wraps(original)
        def to(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            spec = args[0] if args else kwargs.get("device")
            side = side_of_spec(spec, residency) if spec is not None else None
            return result if side is None else moved(self, result, side, "Tensor.to")
        return stay(original, to, None, "Tensor.to")

    def make_cpu(original):
        @functools.wraps(original)
        def cpu(self, *args, **kwargs):
            return moved(self, original(self, *args, **kwargs), HOST, "Tensor.cpu")
        return stay(original, cpu, HOST, "Tensor.cpu")

    def made(data, result, spec, api):
        """What a constructor of ``data`` for ``spec`` returns: a tensor's move, or an array's
        or buffer's adoption (``Residency.adopted``)."""
        side = side_of_spec(spec, residency) if spec is not None else None
        if side is None:
            return result
        if isinstance(data, torch.Tensor):
            return moved(data, result, side, api)
        return residency.adopted(data, result, side, api)

    def make_as_tensor(original):
        @functools.wraps(original)
        def as_tensor(data, *args, **kwargs):
            result = original(data, *args, **kwargs)
            return made(data, result, args[1] if len(args) > 1 else kwargs.get("device"), "torch.as_tensor")
        return as_tensor

    def make_asarray(original):
        @functools.wraps(original)
        def asarray(obj, *args, **kwargs):
            result = original(obj, *args, **kwargs)
            if kwargs.get("copy") is False:
                return result             # sharing asked for: torch's answer (CUDA's refuses a move)
            return made(obj, result, kwargs.get("device"), "torch.asarray")
        return asarray

    def make_numpy(original):
        @functools.wraps(original)
        def numpy(self, *args, **kwargs):
            if kwargs.get("force", args[0] if args else False):
                return original(residency.forced_to_host(self), *args, **kwargs)
            return original(self, *args, **kwargs)
        return numpy

    # Beneath the device translation of Tensor.to and as_tensor (one patch each), or in torch's
    # place where nothing translates them.
    beneath(activation, torch.Tensor, "to", make_to)
    beneath(activation, torch, "as_tensor", make_as_tensor)
    beneath(activation, torch, "asarray", make_asarray)
    activation.replace(torch.Tensor, "numpy", make_numpy)
    activation.replace(torch.Tensor, "cpu", make_cpu)
    _install_storage_moves(activation, residency, side_of_spec)
    _place_deep_copies(activation, residency, host_device)
    _install_module_moves(activation, residency, side_of_spec)
    _copy_loaded_optimizer_state(activation, residency)
    if residency.memory is not None:
        _count_what_optimizers_step(activation, residency.memory)
        _count_what_device_contexts_make(activation, residency.memory)


def _install_device_reading(activation, residency, host_device):
    """``Tensor.device``: the device object of the side the tensor is known to be on (above).

    Known by a move's placing, else by the device memory's count of its storage: a constructor's
    device tensor (``torch.zeros(n, device="cuda")``), a view of device memory, a parameter made
    around one (``nn.Linear(..., device="cuda")``, a model built under ``with torch.device("cuda")``),
    a gradient or optimizer state counted at a step. Such a parameter is placed when first read,
    so ``model.device`` costs a dict probe after."""
    real, real_is_cpu = vars(torch._C.TensorBase)["device"], vars(torch._C.TensorBase)["is_cpu"]
    device_object = activation.backend.target_device(None)
    memory, compiled = residency.memory, activation.compiled
    if compiled is not None:
        reading = compiled.SideDevice(real, real_is_cpu, residency.sides, device_object, host_device,
                                      DEVICE, HOST, PINNED, torch.nn.Parameter, memory, residency.place,
                                      real.__doc__)
    else:
        reading = property(_side_device(real, real_is_cpu, residency, device_object, host_device),
                           real.__set__, doc=real.__doc__)       # the setter: torch's own refusal
    activation.registry.set_attr(torch.Tensor, "device", reading)


def _side_device(real, real_is_cpu, residency, device_object, host_device):
    """The Python twin of ``cudashim._speedups.SideDevice``."""
    real_device, in_host_memory, sides, memory = real.__get__, real_is_cpu.__get__, \
        residency.sides, residency.memory
    Parameter, place = torch.nn.Parameter, residency.place

    def device(self):
        entry = sides.get(id(self))
        if entry is not None:
            side = entry[0]
        elif memory is not None and memory.holds(self):
            if self.__class__ is Parameter:
                place(self, DEVICE)
            side = DEVICE
        else:
            return real_device(self)
        answer = device_object if side is DEVICE else host_device if side in (HOST, PINNED) else None
        # only while the tensor is in host memory (a module moved to "meta" keeps its objects)
        return answer if answer is not None and in_host_memory(self) else real_device(self)

    return device


def compiled_stay(activation, residency):
    """``stay(move, python, side, api)``: the compiled twin of the Python move ``python``
    (``cudashim._speedups.Stay``), which answers a move to where a move placed the tensor
    without a Python frame and hands every other outcome to ``residency.moved``; ``python``
    itself where the compiled fast path does not run. ``side`` None: read off the device
    argument, as ``destination`` reads it."""
    compiled = activation.compiled
    if compiled is None:
        return lambda move, python, side, api: python
    device_object, named = activation.backend.target_device(None), activation.translator.named
    moved = residency.moved
    plain = (torch.Tensor, torch.nn.Parameter)
    # whether a torch function mode or a JIT trace sees torch's calls now; where torch cannot
    # say, torch's move is always asked
    watchers = tuple(torch_names.get(name, None) for name in (
        "torch._C._is_torch_function_mode_enabled", "torch._C._is_tracing"))
    watchers = None if None in watchers else watchers

    def stay(move, python, side, api):
        def decide(tensor, result, side):
            return moved(tensor, result, side, api)
        return compiled_twin(compiled.Stay(move, python, decide, residency.sides, side, device_object,
                                           named, torch._C.TensorBase, DEVICE, HOST, PINNED, plain,
                                           watchers, residency.copying(api)), python)
    return stay


def beneath(activation, owner, name, make):
    """``make(torch's function)`` for the rewrite of ``owner.name`` to wrap."""
    activation.beneath[vars(owner).get(name, getattr(owner, name))] = make


def _place_deep_copies(activation, residency, host_device):
    """``copy.deepcopy`` of a tensor or parameter is where the original is, as on CUDA: an EMA
    model (``deepcopy(model)``), the best weights kept as ``deepcopy(model.state_dict())``. So a
    copy of a device tensor is device memory, counted and known on the device, and a copy of a
    host copy is known on the host."""
    device_object = activation.backend.target_device(None)

    def make(original):
        @functools.wraps(original)
        def __deepcopy__(self, memo):
            result = original(self, memo)
            if result is not self and plain_dense(result):
                side = self.device
                if side is device_object:
                    residency.place(result, DEVICE)
                elif side is host_device:
                    residency.place(result, HOST)
            return result
        return __deepcopy__

    activation.replace(torch.Tensor, "__deepcopy__", make)
    activation.replace(torch.nn.Parameter, "__deepcopy__", make)


def _install_storage_moves(activation, residency, side_of_spec):
    """``UntypedStorage.to``/``cpu`` (the typed storages move through them, and ``cuda()``, which
    the ``tensors`` group translates, through ``to``): copies as a tensor's moves are."""
    def make_to(original):
        @functools.wraps(original)
        def to(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            spec = kwargs.get("device")
            side = side_of_spec(spec, residency) if spec is not None else None
            return residency.storage_moved(self, result, side, "Storage.to")
        return to

    def make_cpu(original):
        @functools.wraps(original)
        def cpu(self, *args, **kwargs):
            return residency.storage_moved(self, original(self, *args, **kwargs), HOST, "Storage.cpu")
        return cpu

    beneath(activation, torch.UntypedStorage, "to", make_to)      # under the tensors group's translation
    activation.replace(torch.UntypedStorage, "cpu", make_cpu)


def _copy_loaded_optimizer_state(activation, residency):
    """``Optimizer.load_state_dict`` (subclasses call it), then ``Residency.loaded_optimizer_state``."""
    def make(original):
        @functools.wraps(original)
        def load_state_dict(self, state_dict, *args, **kwargs):
            result = original(self, state_dict, *args, **kwargs)
            residency.loaded_optimizer_state(self, state_dict)
            return result
        return load_state_dict

    activation.replace(torch.optim.Optimizer, "load_state_dict", make)


def _install_module_moves(activation, residency, side_of_spec):
    """``Module.to``/``cuda``/``cpu``: each tensor moves as a tensor does (above), a view into a
    larger unplaced storage stays, and every parameter and buffer is placed afterwards."""
    Module = torch.nn.Module

    def make_to(original):
        @functools.wraps(original)
        def to(self, *args, **kwargs):
            spec = args[0] if args else kwargs.get("device", kwargs.get("tensor"))
            side = side_of_spec(spec, residency) if spec is not None else None
            if side is None:
                return original(self, *args, **kwargs)
            with residency.module_move(self, side):
                return original(self, *args, **kwargs)
        return to

    def make_fixed(side):
        def make(original):
            @functools.wraps(original)
            def move(self, *args, **kwargs):
                with residency.module_move(self, side):
                    return original(self, *args, **kwargs)
            return move
        return make

    beneath(activation, Module, "to", make_to)
    activation.replace(Module, "cuda", make_fixed(DEVICE))
    activation.replace(Module, "cpu", make_fixed(HOST))


def _count_what_optimizers_step(activation, memory):
    """An optimizer's state and the gradients it steps are device memory where the parameters
    are: made by ops (``zeros_like``, autograd), which neither a move nor a constructor
    places, so they are counted after each step. A 0-dim state (Adam's ``step``) lives on the
    host on CUDA too."""
    from torch.optim.optimizer import register_optimizer_step_post_hook
    Tensor = torch.Tensor

    def stepped(optimizer, args, kwargs):
        state = optimizer.state
        for group in optimizer.param_groups:
            for parameter in group["params"]:
                if not memory.holds(parameter):
                    continue
                if parameter.grad is not None:
                    memory.add(parameter.grad)
                for value in state.get(parameter, {}).values():
                    if isinstance(value, Tensor) and value.dim() > 0:
                        memory.add(value)

    hook = register_optimizer_step_post_hook(stepped)
    activation.registry.add_undo("device memory counted at optimizer steps", hook.remove)


def _count_what_device_contexts_make(activation, memory):
    """A constructor under ``with torch.device("cuda")`` or ``torch.set_default_device("cuda")``
    makes device memory: torch's device mode hands the device to torch's own constructor,
    beneath the factories' patches, so its tensor is counted here (a model built on the device,
    as gpt-fast and torchtitan build theirs)."""
    context = torch_names.get("torch.utils._device.DeviceContext", None)
    constructors = torch_names.get("torch.utils._device._device_constructors", None)
    if context is None or constructors is None:
        return
    constructors, device_object = constructors(), activation.backend.target_device(None)
    is_compiling, Tensor = torch.compiler.is_compiling, torch.Tensor

    def make(original):
        @functools.wraps(original)
        def __torch_function__(self, func, types, args=(), kwargs=None):
            # torch.compile traces this mode's call of every op under the default device:
            # is_compiling() first, which dynamo folds to True, leaves it torch's own call (dynamo
            # failed to guard on the set of constructors reached through this closure).
            if is_compiling() or func not in constructors or self.device is not device_object or \
                    (kwargs and kwargs.get("device") is not None):
                return original(self, func, types, args, kwargs)
            result = original(self, func, types, args, kwargs)
            if isinstance(result, Tensor):
                memory.add(result)
            return result
        return __torch_function__

    activation.replace(context, "__torch_function__", make)

    # Dynamo leaves torch's own frames alone, and compiled this one afresh for each op a
    # compiled function's eager parts made under the device, up to its recompile limit (nano-vllm
    # warned so at every start). It still inlines it where it traces.
    def leave_frames_uncompiled(eval_frame):
        skip_code = torch_names.get("torch._dynamo.eval_frame.skip_code", None)
        if skip_code is not None:
            skip_code(vars(context)["__torch_function__"].__code__)
    activation.when_imported("torch._dynamo.eval_frame", leave_frames_uncompiled)
