"""Device-argument patches as data, applied by one rewriter.

Most patches rewrite one argument and call the original: ``Tensor.to``, the factories,
``new_*``, ``GradScaler``'s device, ``DeviceMesh``, FSDP, the profiler, ``torch.load``. Each
is a ``Rewrite``: the target (``"module:attribute.path"``), the arguments to rewrite (the
parameter's name, where it sits positionally, what kind of value it holds) and the API name
the report uses. ``apply()`` turns one into a patch recorded in the activation's registry,
waiting with a post-import hook when the module is not imported yet. The translate functions
it builds count every translated call in the report, so no patch counts by hand.
"""

from __future__ import annotations

import functools
import importlib
import logging
import operator
from typing import Any, Callable, NamedTuple, Optional, Tuple

import torch
import wrapt

from .signatures import signature

log = logging.getLogger(__name__)

NOTHING = object()          # an argument without a value to assume when the caller passes none
_REAL_DEVICE = torch._C.device


class Kind(NamedTuple):
    """What an argument holds, and how to build its translate function for one API."""
    name: str
    # (activation, api) -> translate, or None where this target needs no rewriting
    build: Callable[[Any, str], Optional[Callable[[Any], Any]]]
    # A positional value of another class is some other argument (``t.to(torch.half)``).
    positional_classes: Optional[frozenset] = None


def _bound_device(activation, api):
    """A device a collective or DDP binds: the target's, or none on the CPU (gloo binds none)."""
    translate = activation.translator.for_api(api)
    if activation.backend.device_type != "cpu":
        return translate

    def bound_or_dropped(device):
        target = translate(device)
        return None if target.__class__ is _REAL_DEVICE and target.type == "cpu" else target
    return bound_or_dropped


def _eager_device(activation, api):
    """The device a process group connects to eagerly (``init_process_group(device_id=)``):
    as a bound device, but none where collectives are staged through host memory, whose one
    Python process group has no backend per device to connect."""
    from ..backends import staged
    if activation.backend.collective == staged.NAME:
        return lambda device: None
    return _bound_device(activation, api)


def _bound_devices(activation, api):
    translate = activation.translator.for_api(api)
    if activation.backend.device_type == "cpu":
        return lambda devices: None
    return lambda devices: [translate(device) for device in devices]


def _bound_indices(activation, api):
    """Device indices of the current device type (``barrier(device_ids=[0])``): kept,
    but dropped on the CPU, where gloo binds no device."""
    if activation.backend.device_type == "cpu":
        return lambda indices: None
    return lambda indices: indices


def _profiler_activities(activation, api):
    """``ProfilerActivity.CUDA`` becomes the target's activity, or is dropped where there is
    none: left in on a build without CUDA, the profiler logs a failure on every op."""
    from torch.profiler import ProfilerActivity
    replacement = activation.backend.profiler_activity
    target = getattr(ProfilerActivity, replacement) if replacement else None

    def translate(activities):
        if ProfilerActivity.CUDA not in activities:
            return activities
        activation.count(api, target or "dropped")
        kept = [a for a in activities if a != ProfilerActivity.CUDA]
        if target is not None and target not in kept:
            kept.append(target)
        return kept or [ProfilerActivity.CPU]

    return translate


def _pin_memory(activation, api):
    """``pin_memory=True`` where the target computes on host memory, which torch cannot pin
    without an accelerator (it refuses): the memory is host memory already. None (nothing
    to rewrite) where the target pins."""
    if activation.backend.can_pin_memory():
        return None

    def unpinned(pin):
        if pin:
            activation.count(api, "host memory (not pinned)")
        return False
    return unpinned


DEVICE = Kind("device", lambda activation, api: activation.translator.for_api(api),
              positional_classes=frozenset({str, int, _REAL_DEVICE}))
DEVICE_TYPE = Kind("device type", lambda activation, api: activation.translator.type_for(api))
BOUND_DEVICE = Kind("bound device", _bound_device)
EAGER_DEVICE = Kind("eagerly connected device", _eager_device)
BOUND_DEVICES = Kind("bound devices", _bound_devices)
BOUND_INDICES = Kind("bound device indices", _bound_indices)
PROFILER_ACTIVITIES = Kind("profiler activities", _profiler_activities)
PIN_MEMORY = Kind("pin_memory", _pin_memory)


class Argument(NamedTuple):
    kind: Kind
    parameter: str = "device"
    # Index among the positional arguments as the patched callable receives them (``self``
    # counts). None: read from the original's signature, or keyword only where it has none.
    position: Optional[int] = None
    # The value to translate when the caller passes none (``GradScaler()`` means "cuda").
    # With one, every value is translated, None too.
    missing: Any = NOTHING


class Rewrite(NamedTuple):
    target: str                                  # "module:attribute.path"
    arguments: Tuple[Argument, ...]
    api: Optional[str] = None                    # the report's name; default the target's
    aliases: Tuple[str, ...] = ()                # other "module:name" holding the same object
    # False keeps the Python wrapper alone, no compiled twin: for a target dynamo registers a
    # polyfill for when it is imported, which must be a Python function.
    compiled: bool = True
    # True: a tensor the call makes on the target's device goes to ``activation.placing``
    # (a constructor's device is a keyword: the one read).
    places: bool = False
    # True: a call that names no device makes its tensor where its first argument is
    # (``torch.zeros_like(x)``, ``x.new_zeros(n)``), so it is placed where that argument's
    # device is the target's (``Tensor.device`` names the side where device memory is host memory).
    inherits: bool = False

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def path(self) -> str:
        return self.target.partition(":")[2]

    @property
    def api_name(self) -> str:
        return self.api or f"{self.module}.{self.path}".replace(".__init__", "")


def rewrite(target: str, kind: Kind, parameter: str = "device", position: Optional[int] = None,
            missing: Any = NOTHING, api: Optional[str] = None, aliases: Tuple[str, ...] = (),
            compiled: bool = True, places: bool = False) -> Rewrite:
    """A rewrite of one argument (the common case)."""
    return Rewrite(target, (Argument(kind, parameter, position, missing),), api, aliases, compiled,
                   places)


def apply(activation, declaration: Rewrite) -> None:
    """Patch the declaration's target now, or when its module is imported. A module imported
    after deactivation is left alone."""

    def patch(module):
        try:
            owner, name, original = wrapt.resolve_path(module, declaration.path)
        except AttributeError:       # not in this torch release
            log.debug("cudashim: %s is absent in this torch; not patched", declaration.target)
            return
        wrapper = type(original) if isinstance(original, (staticmethod, classmethod)) else None
        function = original.__func__ if wrapper else original      # rewrite the function inside
        beneath = activation.beneath.get(function)
        inner = function if beneath is None else beneath(function)
        replacement = rewritten(activation, declaration, inner)
        if replacement is function:
            return                   # nothing to rewrite on this target
        if wrapper:
            replacement = wrapper(replacement)
        activation.registry.set_attr(owner, name, replacement)
        for alias in declaration.aliases:
            alias_module, _, alias_name = alias.partition(":")
            alias_owner = importlib.import_module(alias_module)
            if getattr(alias_owner, alias_name, None) is original:
                activation.registry.set_attr(alias_owner, alias_name, replacement)

    activation.when_imported(declaration.module, patch)


def rewritten(activation, declaration: Rewrite, original):
    """``original`` with the declared arguments translated."""
    slots = [_slot(activation, declaration, argument, original) for argument in declaration.arguments]
    slots = [slot for slot in slots if slot[2] is not None]
    if not slots:
        return original
    placing = activation.placing if declaration.places else None
    # Where a pin_memory=True is rewritten (the target cannot pin), the tensor made is known
    # as pinned host memory all the same (``activation.pinning``).
    pinning = activation.pinning if declaration.places and any(
        argument.kind is PIN_MEMORY for argument in declaration.arguments) and any(
        keyword == "pin_memory" for _, keyword, _, _, _ in slots) else None
    compiled_original = original
    if placing is not None:
        original = _placing(original, *placing, inherits=declaration.inherits)
    if len(slots) == 1 and slots[0][4] is NOTHING:
        function = _one_argument(original, *slots[0][:4])
    elif all(position is None and missing is NOTHING for position, _, _, _, missing in slots):
        function = _keywords_only(original, [(keyword, translate) for _, keyword, translate, _, _ in slots])
    else:
        return functools.wraps(original)(_any_arguments(original, slots))
    if pinning is not None:
        function = _pinning(function, pinning)
    function = functools.wraps(original)(function)
    if activation.compiled is None or not declaration.compiled:
        return function
    return compiled_twin(_compiled(activation, compiled_original, slots, placing, pinning,
                                   declaration.inherits), function)


def compiled_twin(compiled, python):
    """``compiled``, named as ``python`` is, with ``python`` as its twin: torch.compile
    traces the twin (patches/compiled.py), which behaves the same."""
    functools.update_wrapper(compiled, python, updated=())
    compiled.__wrapped__ = python.__wrapped__ if hasattr(python, "__wrapped__") else python
    compiled.python_twin = python
    # torch 2.7's dynamo guards a traced twin's closure through the name it found the wrapper
    # by (F.linear.__closure__[0]): the wrapper answers with its twin's cells.
    compiled.__closure__ = getattr(python, "__closure__", None)
    # Modules keep functions as attributes (nn.TransformerEncoderLayer's ``activation`` is
    # F.gelu) and are deep-copied (its encoder clones the layer) and pickled (torch.save of a
    # whole model). A function is copied as itself, and pickled as the function it wraps:
    # a pickle made under cudashim loads without it.
    compiled.__deepcopy__ = functools.partial(_itself, compiled)
    compiled.__reduce_ex__ = functools.partial(_as_the_wrapped_function, compiled.__wrapped__)
    return compiled


def _itself(function, memo):
    return function


def _as_the_wrapped_function(wrapped, protocol):
    return operator.getitem, ((wrapped,), 0)


def _slot(activation, declaration, argument, original):
    position = argument.position
    if position is None:
        position = _signature_position(original, argument.parameter)
    translate = argument.kind.build(activation, declaration.api_name)
    return position, argument.parameter, translate, argument.kind.positional_classes, argument.missing


def _signature_position(original, parameter: str) -> Optional[int]:
    found = signature(original)
    if found is None:                                # a C function: keywords only
        return None
    parameters = list(found.parameters.values())
    for index, p in enumerate(parameters):
        if p.name == parameter:
            positional = p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
            return index if positional else None
    return None


def _compiled(activation, original, slots, placing=None, pinning=None, inherits=False):
    """The compiled twin of ``_one_argument`` and ``_keywords_only``: the same rewriting,
    without a Python frame, reading the translator's caches directly."""
    translation = activation.translator.compiled_translation
    device, placed, memory = placing or (None, None, None)
    return activation.compiled.Rewriter(original, tuple(
        (position, keyword, classes, *translation(translate))
        for position, keyword, translate, classes, _ in slots), device, placed, pinning,
        memory if inherits else None)


def _pinning(function, pinned):
    """``function``, handing ``pinned`` the tensor a call with ``pin_memory=True`` makes; not
    while torch.compile traces (a graph records no pinning)."""
    is_compiling = torch.compiler.is_compiling

    def pinning(*args, **kwargs):
        pin = kwargs.get("pin_memory") is True if kwargs else False
        result = function(*args, **kwargs)
        if pin and not is_compiling():
            pinned(result)
        return result
    return pinning


def _placing(original, device, place, memory, inherits=False):
    """``original``, handing ``place`` the tensor it makes where its translated device is
    ``device`` (``inherits``: or where it names none and ``memory`` holds its first argument).
    Beneath the rewriting, so it sees the device the rewrite made; not while torch.compile
    traces (a graph records no placement)."""
    is_compiling = torch.compiler.is_compiling

    @functools.wraps(original)
    def placing(*args, **kwargs):
        result = original(*args, **kwargs)
        named = kwargs.get("device")
        if named is device or (inherits and named is None and args and memory.holds(args[0])):
            if not is_compiling():
                place(result)
        return result
    return placing


def _one_argument(original, position, keyword, translate, classes):
    """The hot path: one argument, nothing assumed when absent. A call that passes no
    keywords and too few positionals costs one length check."""
    if position is None:
        def keyword_only(*args, **kwargs):
            if kwargs:                                 # most calls without a device pass none
                value = kwargs.get(keyword)
                if value is not None:
                    kwargs[keyword] = translate(value)
            return original(*args, **kwargs)
        return keyword_only

    def positional_or_keyword(*args, **kwargs):
        if len(args) > position:
            value = args[position]
            if value is not None and (classes is None or value.__class__ in classes):
                args = args[:position] + (translate(value),) + args[position + 1:]
        elif kwargs:
            value = kwargs.get(keyword)
            if value is not None:
                kwargs[keyword] = translate(value)
        return original(*args, **kwargs)
    return positional_or_keyword


def _keywords_only(original, keywords):
    """Several keyword-only arguments (a constructor's device and pin_memory): a call
    without keywords costs one check, as with one. Two, the common case, are unrolled."""
    if len(keywords) == 2:
        (first, translate_first), (second, translate_second) = keywords

        def two_keywords(*args, **kwargs):
            if kwargs:
                value = kwargs.get(first)
                if value is not None:
                    kwargs[first] = translate_first(value)
                value = kwargs.get(second)
                if value is not None:
                    kwargs[second] = translate_second(value)
            return original(*args, **kwargs)
        return two_keywords

    def keywords_rewritten(*args, **kwargs):
        if kwargs:
            for keyword, translate in keywords:
                value = kwargs.get(keyword)
                if value is not None:
                    kwargs[keyword] = translate(value)
        return original(*args, **kwargs)
    return keywords_rewritten


def _any_arguments(original, slots):
    def rewritten_call(*args, **kwargs):
        for position, keyword, translate, classes, missing in slots:
            if position is not None and len(args) > position:
                value = args[position]
                if (value is not None or missing is not NOTHING) and \
                        (classes is None or value.__class__ in classes):
                    args = args[:position] + (translate(value),) + args[position + 1:]
            elif keyword in kwargs:
                value = kwargs[keyword]
                if value is not None or missing is not NOTHING:
                    kwargs[keyword] = translate(value)
            elif missing is not NOTHING:
                kwargs[keyword] = translate(missing)
        return original(*args, **kwargs)
    return rewritten_call
