"""Precision at the target's speed: float16 matmuls by shape class, and TF32 flags mapped.

Where the precision policy (``cudashim.precision``) says float16 is slow on the target, the
matmul family (mm, bmm, addmm, baddbmm, addbmm, matmul, inner, tensordot, einsum, linalg's
matmul and multi_dot, linear, bilinear, cdist, the convolutions, scaled_dot_product_attention,
the Tensor methods, ``@`` and the in-place ``addmm_``/``baddbmm_``/``addbmm_``, the fused
inference paths of ``nn.MultiheadAttention`` and ``nn.TransformerEncoderLayer``, and the
recurrent layers' fused ops, whose time is their products) computes float16 inputs in
the policy's choice for the call's shape class: a product of few rows a matrix (decoding) is
memory-bound, and may run in float16 as asked, whose weights are half float32's size; a
larger one computes in float32 (or bfloat16 where that is the host's fastest) and rounds the
result to float16 once, as CUDA's tensor cores accumulate. Convolutions, einsum and the
chained and contracted products count as compute-bound. Attention has choices of its own,
measured on attention calls (``MatmulChoices.attention``): it keeps no weights, and torch's CPU
attention kernels are not its products'. Tensors keep their dtype, and a
result the layout torch's own call gives it (attention's output on heads split off a fused
projection is laid out batch, position, head); a result asked for in an ``out=`` tensor, or in
the tensor an in-place method is called on, is rounded into it. A call whose first tensor is
not float16 goes straight to torch after one dtype check; a call with float16 inputs mixed
with other dtypes is torch's to judge; inside an autocast region autocast decides. Inside a
CUDA autocast region the policy runs in float32 (autocast off), mixed dtypes that torch
refuses are computed in float32, as autocast would have cast them: Fabric's "bf16-mixed"
hands bfloat16 batches to float32 weights there. Parameters no gradient flows to
(inference, and the forward of autograd Functions such as Megatron's tensor-parallel layers)
are widened once per version and storage and kept, so ``model.half()`` generation does not
convert every weight on every token; an optimizer step, and a read of a parameter's
``.data``, drop them.

The other float16 ops a model runs (normalization, softmax, pooling, GELU, resampling) are
computed in float32 only where the host measured that faster by a clear margin
(``by_measurement``, ``tables/float16_ops.WIDEN_BELOW``); elsewhere, most hosts, they run as
asked and are not wrapped at all. A call with no gradient recorded, kept parameters and plain
host operands, nearly every call of inference, is computed in one frame (``_at_once``; its
compiled twin ``AtOnce`` where the fast path runs). In bfloat16 on a host CPU, linear layers and
conv2d read their weights packed for oneDNN, and the fused attention layers are computed op by op
on packed weights (``_on_packed_weight_of``).

Where the target has a reduced-precision float32 matmul, the program's own TF32 flags
(``torch.backends.cuda.matmul.allow_tf32``, ``...matmul.fp32_precision``,
``torch.backends.cudnn.allow_tf32``, ``torch.set_float32_matmul_precision``) turn it on and
off, as they do TF32 on CUDA.
"""

from __future__ import annotations

import functools
import os
import threading
import types
import weakref
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

from .. import torch_names
from ..backends import timing
from ..graphs import graph
from ..kernels import native, packed_convolution, packed_encoder_layer, packed_linear
from ..kernels.out_tensors import written_to
from ..patching.rewriter import compiled_twin
from ..patching.signatures import by_position
from ..patching.watched import WatchedAttributes
from ..precision import AS_ASKED, BFLOAT16, FLOAT32
from ..tables import float16_ops

HALF = torch.float16
_REDUCED = (torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)     # host tensors the compiled conversion takes


def converted(tensor, dtype):
    """``tensor`` in ``dtype``. Between float16 and bfloat16, the policy's conversion on every
    call computed in bfloat16, not as torch converts: torch's CPU kernels go element by element
    there (2^21 elements: 0.69 ms on an AVX-512 EPYC), though they convert to and from float32
    with vector instructions (0.15 ms by way of float32). The compiled kernels convert in one
    pass where the CPU has F16C (``kernels.native.reduced_converted``); elsewhere, and for what
    they leave to torch, by way of float32. The values are torch's either way: both types are
    exact in float32, and each conversion rounds once, to nearest even."""
    if tensor.dtype in _REDUCED and dtype in _REDUCED and tensor.dtype is not dtype:
        fast = native.reduced_converted(tensor, dtype) if native.usable() and not graph.capturing_here() \
            else None                       # a capture records torch's ops only
        return fast if fast is not None else tensor.float().to(dtype)
    return tensor.to(dtype)


# The Tensor methods that write their product into the tensor they are called on.
_IN_PLACE = ("addmm_", "baddbmm_", "addbmm_")
# Computed in float32 where the policy's choice is bfloat16. A Euclidean distance is taken as
# |x|^2 + |y|^2 - 2 x.y, whose terms cancel, and bfloat16's 8-bit significand would leave the
# distance between near points no correct digit. torch's bilinear (its _trilinear) runs slower
# in bfloat16 than in float32 on every host measured: 256 rows of 512, 3.6 ms against 1.47 on an
# AVX-512 BF16 EPYC, 71.9 against 4.88 on an AVX2 one.
_FLOAT32_ONLY = frozenset({"cdist", "bilinear"})

# (owner, name, where the first tensor is) for every function computed wider: every product
# of matrices torch offers (torch's CPU kernels compute each in float16 at 6x to 200x
# float32's time here), the ones that contract tensors or chain products included.
_FUNCTIONS = (
    *((torch, name, 0) for name in ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul",
                                   "inner", "tensordot", "chain_matmul", "bilinear", "cdist",
                                   "conv1d", "conv2d", "conv3d")),
    (torch, "einsum", 1),
    *((torch.linalg, name, 0) for name in ("matmul", "multi_dot")),
    *((F, name, 0) for name in ("linear", "bilinear", "conv1d", "conv2d", "conv3d",
                               "conv_transpose1d", "conv_transpose2d", "conv_transpose3d",
                               "scaled_dot_product_attention")),
    *((torch.Tensor, name, 0) for name in ("mm", "bmm", "addmm", "baddbmm", "addbmm", "matmul",
                                          "inner", "__matmul__", "__rmatmul__",
                                          *_IN_PLACE)),
)
# The fused inference paths nn.MultiheadAttention and nn.TransformerEncoderLayer take under
# no_grad (torch's "fast path"): one C call each, projections, attention and the MLP inside,
# out of reach of the functions above.
_FUSED_LAYERS = ("_native_multi_head_attention", "_transformer_encoder_layer_fwd")
# The recurrent layers (nn.LSTM, nn.GRU, nn.RNN and their cells) call torch._VF's fused ops, the
# products inside. They count as compute-bound, as the convolutions do: a step's products are
# small enough for the caches, so float16's half-size weights buy nothing (as asked, a 2-layer
# LSTM of 256 on a batch of 2 took 2.4x float32 here, of 32 8x).
_RECURRENT = ("lstm", "gru", "rnn_tanh", "rnn_relu", "lstm_cell", "gru_cell", "rnn_tanh_cell",
              "rnn_relu_cell")


def _functions():
    fused = [(torch, name, 0) for name in _FUSED_LAYERS if torch_names.has(f"torch.{name}")]
    variable_functions = torch_names.get("torch._VF", None)
    if variable_functions is not None:
        fused += [(variable_functions, name, 0) for name in _RECURRENT
                  if callable(getattr(variable_functions, name, None))]
    # chain_matmul is deprecated, and a later torch may drop it.
    return (*((owner, name, first) for owner, name, first in _FUNCTIONS
              if callable(getattr(owner, name, None))), *fused)


def install(activation):
    policy = activation.precision
    if policy.widens_float16:
        # Measured (or read from the cache) now, not at the first float16 matmul, which may
        # come while torch.compile traces the family; the other ops before any is replaced.
        policy.float16_matmuls
        policy.float16_ops
        cache = WideningCache()
        activation.registry.add_undo("float16 weights kept in float32", cache.clear)
        activation.registry.add_undo("float16 conversion buffers", _SCRATCH.clear)
        activation.registry.add_undo("convolutions' forms timed", _PACKED_OR_PLAIN.clear)
        # An optimizer may write parameters in ways no version counter sees (master weights
        # copied back into float16 ones through ``.data``, fused kernels writing in place):
        # every step drops every copy, and so does every read of a parameter's ``.data``.
        from torch.optim.optimizer import register_optimizer_step_post_hook
        stepped = register_optimizer_step_post_hook(lambda *_: cache.optimizer_stepped())
        activation.registry.add_undo("kept copies dropped at optimizer steps", stepped.remove)
        _drop_copies_at_data_reads(activation, cache)
        at_once = _at_once_for(activation.compiled)
        for owner, name, first in _functions():
            api = f"{getattr(owner, '__name__', owner)}.{name}"
            activation.replace(owner, name, functools.partial(
                by_policy, api, first, activation.backend.device_type, cache,
                activation.count, policy.float32_regions, policy, _ROWS.get(name),
                activation.compiled, in_place=owner is torch.Tensor and name in _IN_PLACE,
                float32_only=name in _FLOAT32_ONLY, attention=name == "scaled_dot_product_attention",
                at_once=at_once, on_packed=_on_packed_weight_of(owner, name)))
        for name in policy.widened_ops:
            up_to = policy.float16_ops[name].get("widened_up_to")
            for owner, attribute, api in float16_ops.places(name):
                activation.replace(owner, attribute, functools.partial(
                    by_measurement, api, activation.backend.device_type, cache, activation.count,
                    activation.compiled, at_once=at_once, up_to=up_to,
                    only_when=float16_ops.ONLY_WHEN.get(name, (None,))[0]))
    if policy.float32_matmul_precision is not None:
        _map_tf32(activation, policy.float32_matmul_precision)


# --- the shape class of a call ------------------------------------------------------------
def _rows_of_a_product(left, right):
    """Rows a matrix of ``left @ right``: per matrix where the right operand is a batch of
    matrices (attention's scores), else every row of the left one (a layer's weight shared)."""
    if right.dim() >= 3:
        return left.shape[-2] if left.dim() >= 2 else 1
    return left.numel() // left.shape[-1] if left.dim() and left.shape[-1] else None


def _rows_of_each_position(args, kwargs):
    """Rows of a layer's projections: one per position of its input, every token of every
    sequence (a nested batch, as an encoder makes of a padded one, counts its tokens)."""
    x = args[0]
    try:
        width = x.size(-1) if x.dim() else 0           # a nested tensor has no .shape
        return x.numel() // width if width else None
    except RuntimeError:                               # a layout that cannot say: compute-bound
        return None


def _rows_of_matmul(args, kwargs):
    left, right = args[0], args[1] if len(args) > 1 else kwargs.get("other")
    return _rows_of_a_product(left, right) if isinstance(right, torch.Tensor) else None


def _rows_of_addmm(args, kwargs):
    return args[1].shape[0] if len(args) > 1 else None


def _rows_of_batched_addition(args, kwargs):
    return args[1].shape[-2] if len(args) > 1 else None


# name -> (args, kwargs) -> rows a matrix of the product, None where not known (compute-bound)
_ROWS = {
    "linear": _rows_of_each_position,
    "_native_multi_head_attention": _rows_of_each_position,
    "_transformer_encoder_layer_fwd": _rows_of_each_position,
    "mm": _rows_of_matmul, "matmul": _rows_of_matmul, "__matmul__": _rows_of_matmul,
    "bmm": lambda args, kwargs: args[0].shape[-2],
    "__rmatmul__": lambda args, kwargs: (_rows_of_a_product(args[1], args[0])
                                         if len(args) > 1 and isinstance(args[1], torch.Tensor) else None),
    "inner": _rows_of_each_position,                  # inner(a, b) contracts their last dimensions
    "bilinear": _rows_of_each_position,
    "addmm": _rows_of_addmm, "addmm_": _rows_of_addmm,
    "baddbmm": _rows_of_batched_addition, "baddbmm_": _rows_of_batched_addition,
    "addbmm": _rows_of_batched_addition, "addbmm_": _rows_of_batched_addition,
    "scaled_dot_product_attention": lambda args, kwargs: args[0].shape[-2],
}


# --- float16 by the policy ----------------------------------------------------------------
class WideningCache:
    """float32 (or bfloat16) copies of float16 parameters that no gradient flows to, per
    tensor version.

    A copy is used again only while the parameter still holds the same storage (a
    parameter whose ``.data`` was replaced, as ZeRO-3 does at every gather, may get a new
    storage at the old address) at the same version, and until the next optimizer step or
    read of the parameter's ``.data``; parameters that require grad are kept only while
    no gradient is recorded (inference, evaluation). The copies cost twice the float16
    parameters' memory (what a float32 port holds), up to a quarter of the machine's memory;
    parameters past that are widened on every call, which is slower but holds nothing.

    The copies a linear layer computed in bfloat16 reads where its weight is packed for oneDNN
    (``kernels.packed_linear``) are kept apart, in ``packed.copies`` (``packed_transposed``'s for
    weights laid out in x out), under the same keys, so that ``_at_once`` and its compiled twin
    read them as they read ``copies``: the weight packed (and not also kept plain here), the
    bias a plain bfloat16 copy. A conv2d's packed weight and its bias are kept alike, in
    ``packed_convolutions.copies``, with the arguments the weight was packed for."""

    def __init__(self, budget_bytes: int = None):
        # (id(parameter), dtype) -> (weak ref, version, weak storage, copy)
        self.copies = {}
        self.packed = types.SimpleNamespace(copies={})
        self.packed_transposed = types.SimpleNamespace(copies={})     # weights laid out in x out
        # conv2d's, and the (padding, stride, dilation, groups) each was packed for
        self.packed_convolutions = types.SimpleNamespace(copies={}, arguments={})
        self.budget = _quarter_of_memory() if budget_bytes is None else budget_bytes
        self.held = 0

    def widen(self, tensor, dtype=torch.float32, scratch=None, copies=None):
        """``tensor`` in ``dtype``, kept in ``copies`` (``self.copies`` where not given) where it
        is a parameter that may be kept."""
        if graph.capturing_here():          # a replay would not follow a weight written between replays
            return converted(tensor, dtype)
        copies = self.copies if copies is None else copies
        key = (id(tensor), dtype)
        kept = copies.get(key)
        if self._still_holds(kept, tensor):
            return kept[3]
        if not self._keeps(tensor):
            return scratch.converted(tensor, dtype) if scratch is not None else converted(tensor, dtype)
        storage = tensor.untyped_storage()            # one Python object while it lives
        wide = converted(tensor.detach(), dtype)
        self._keep(copies, key, tensor, storage, wide)
        return wide

    def packed_weight(self, weight, transposed=False):
        """``weight`` (a float16 linear layer's, out x in; ``transposed``: in x out) in bfloat16
        packed for oneDNN's linear, kept in place of its plain bfloat16 copy. None where it would
        not be kept (a gradient flows to it, it is a view into a larger buffer, the budget is
        spent): packing costs more than the call it would serve."""
        copies = (self.packed_transposed if transposed else self.packed).copies
        return self._packed(weight, copies, lambda wide: packed_linear.pack(wide.t() if transposed else wide))

    def packed_convolution_weight(self, weight, arguments, input_size, pack=None):
        """``weight`` (a float16 conv2d's) in bfloat16 packed for oneDNN's convolution of
        ``arguments`` (padding, stride, dilation, groups) over inputs of ``input_size``, kept as
        ``packed_weight`` keeps a linear layer's; packed again for other arguments. ``pack``:
        ``packed_convolution.pack`` where not given, or ``pack_transposed`` for a transposed
        convolution's, whose arguments (padding, output_padding, stride, dilation, groups) are
        never a conv2d's."""
        pack = packed_convolution.pack if pack is None else pack
        kept = self.packed_convolutions
        key = (id(weight), torch.bfloat16)
        if kept.arguments.get(key) != arguments:
            self._forget(key, kept.copies)
        packed = self._packed(weight, kept.copies, lambda wide: pack(wide, *arguments, input_size))
        if packed is not None:
            kept.arguments[key] = arguments
        return packed

    def _packed(self, weight, copies, pack):
        """``weight`` in bfloat16 as ``pack`` lays it out, kept in ``copies`` in place of its plain
        bfloat16 copy, or None where it would not be kept."""
        key = (id(weight), torch.bfloat16)
        kept = copies.get(key)
        if self._still_holds(kept, weight):
            return kept[3]
        if not self._keeps(weight):
            return None
        plain = self.copies.get(key)
        plain = plain[3] if self._still_holds(plain, weight) else None
        room = self.budget - self.held + (plain.numel() * plain.element_size() if plain is not None else 0)
        if weight.numel() * torch.bfloat16.itemsize > room:
            return None
        storage = weight.untyped_storage()
        wide = plain if plain is not None else converted(weight.detach(), torch.bfloat16)
        packed = pack(wide)
        self._forget(key)
        self._keep(copies, key, weight, storage, packed)
        return packed

    @staticmethod
    def _still_holds(kept, tensor) -> bool:
        """Whether a kept entry is a copy of what ``tensor`` holds now. A copy is kept only of a
        parameter that owned its storage; a parameter moved onto other memory (set_, resize_,
        as_strided_) moves its version, and ``.data`` drops it."""
        return kept is not None and kept[0]() is tensor and kept[1] == tensor._version \
            and kept[2]() is tensor.untyped_storage() \
            and not (tensor.requires_grad and torch.is_grad_enabled())

    @staticmethod
    def _keeps(tensor) -> bool:
        """Whether a copy of ``tensor`` may be kept."""
        return isinstance(tensor, torch.nn.Parameter) \
            and not (tensor.requires_grad and torch.is_grad_enabled()) \
            and _owns_its_storage(tensor)

    def _keep(self, copies, key, tensor, storage, copy):
        """``copy`` of ``tensor`` kept in ``copies`` under ``key``, in place of what was there,
        where the budget allows."""
        size = copy.numel() * copy.element_size()
        self._forget(key, copies)
        if self.held + size <= self.budget:
            copies[key] = (weakref.ref(tensor, lambda _, key=key: self._forget(key, copies)),
                           tensor._version, weakref.ref(storage), copy)
            self.held += size

    def _forget(self, key, copies=None):
        kept = (self.copies if copies is None else copies).pop(key, None)
        if kept is not None:
            self.held -= kept[3].numel() * kept[3].element_size()

    def keep_copies_of_one_form(self, parameters, packed):
        """Of ``parameters``' bfloat16 copies (a convolution's weight and bias, None for none),
        only those a packed convolution reads (``packed``), or only the plain ones."""
        dropped = self.copies if packed else self.packed_convolutions.copies
        for parameter in parameters:
            if parameter is not None:
                self._forget((id(parameter), torch.bfloat16), dropped)
                if not packed:
                    self.packed_convolutions.arguments.pop((id(parameter), torch.bfloat16), None)

    def clear(self):
        for copies in self._all_copies():
            copies.clear()
        self.packed_convolutions.arguments.clear()
        self.held = 0

    def _all_copies(self):
        return (self.copies, self.packed.copies, self.packed_transposed.copies,
                self.packed_convolutions.copies)

    def drop(self, parameter):
        """Forget ``parameter``'s copies: its next call widens what it then holds."""
        for copies in self._all_copies():
            if copies:
                for dtype in (torch.float32, torch.bfloat16):
                    self._forget((id(parameter), dtype), copies)

    def optimizer_stepped(self):
        """Parameters may have changed where no version counter shows it: none is kept."""
        self.clear()


def _drop_copies_at_data_reads(activation, cache):
    """A write through ``parameter.data`` (``weight.data += delta``, as PEFT merges an adapter
    into a frozen layer) moves no version counter, so no check at the call can see it. Every
    such write starts with a read of ``.data``; the read (and an assignment) drops the
    parameter's copies first. A ``.data`` tensor held and written later still goes unseen."""
    data = vars(torch._C.TensorBase)["data"]

    def read(parameter):
        cache.drop(parameter)
        return data.__get__(parameter)

    def assign(parameter, value):
        cache.drop(parameter)
        data.__set__(parameter, value)

    activation.registry.add_attr(torch.nn.Parameter, "data", property(read, assign, doc=data.__doc__))


def _owns_its_storage(parameter) -> bool:
    """Whether the parameter's memory is its own. A parameter that is a view into a larger
    buffer (ZeRO-3's gathered parameters, FSDP's flat parameters) changes when the buffer
    is written, without its version counter moving: it is never kept."""
    return (parameter.storage_offset() == 0 and parameter.untyped_storage().nbytes()
            == parameter.numel() * parameter.element_size())


def _quarter_of_memory() -> int:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 4
    except (AttributeError, ValueError, OSError):      # no sysconf (Windows): a fixed budget
        return 4 * 2 ** 30


def by_policy(api, first, device_type, cache, count, regions, policy, rows_of, compiled, original,
              *, in_place=False, float32_only=False, attention=False, at_once=None, on_packed=None):
    """``original`` computing float16 inputs as the policy chooses; its compiled gate where
    the fast path runs (``_speedups_precision.c``), which behaves as the Python wrapper.
    ``in_place``: ``original`` is a Tensor method writing into the tensor it is called on;
    ``float32_only``: a bfloat16 choice computes it in float32; ``attention``: ``original`` is
    attention, computed in attention's own choices; ``at_once``: ``_at_once`` or its compiled
    twin (``_at_once_for``); ``on_packed``: ``original`` computed in bfloat16 on its weight kept
    packed for oneDNN, where that runs (``_on_packed_weight_of``)."""
    at_once = _at_once if at_once is None else at_once
    def reconciled(*args, **kwargs):
        """In a CUDA region run in float32: float16 and bfloat16 operands in float32, as
        autocast would have cast them to its dtype; elsewhere torch's judgement stands (and
        always for a call that writes into a tensor of its own, which autocast never casts)."""
        if not regions.depth or torch.is_autocast_enabled(device_type) or in_place \
                or "out" in kwargs:
            return original(*args, **kwargs)
        count(api, "mixed dtypes computed in float32 (autocast region in float32)")
        return original(*[_float32(value, cache) for value in args],
                        **{name: _float32(value, cache) for name, value in kwargs.items()})

    memory_bound_api = f"{api} (memory-bound)"
    # A float32 choice runs as it was timed, in plain float32, where the program's TF32 flags
    # have turned on oneDNN's bfloat16 precision for float32 matmuls: torch's CPU attention at a
    # decoding step's sizes took 3 to 10 times as long with it on an AVX-512 BF16 EPYC (one query
    # over 16 positions a head: 0.87 ms against 0.08), its blocks too small to gain from it.
    plain = _in_plain_float32(original) if policy.float32_matmul_precision is not None else None

    def widened(*args, **kwargs):
        if torch.is_autocast_enabled(device_type):
            return original(*args, **kwargs)           # autocast's call
        tensors = _half_operands((*args, *kwargs.values()) if kwargs else args)
        if tensors is None:
            return reconciled(*args, **kwargs)
        try:
            rows = rows_of(args, kwargs) if rows_of is not None else None
        except (IndexError, AttributeError, TypeError):   # a call shape torch will judge
            rows = None
        choices = policy.float16_matmuls.of_attention() if attention else policy.float16_matmuls
        memory_bound = choices.is_memory_bound(rows)
        choice = choices.memory_bound if memory_bound else choices.compute_bound
        # The report has one row per API and what it became: decoding-sized calls get their own.
        reported = memory_bound_api if memory_bound else api
        if choice == AS_ASKED:
            count(reported, "float16 as asked")
            return original(*args, **kwargs)
        if choice == BFLOAT16 and float32_only:
            choice = FLOAT32
        dtype = torch.bfloat16 if choice == BFLOAT16 else torch.float32
        if _traced(tensors):
            # torch.compile traces this: torch's ops only, as a capture records them. Where the
            # program's TF32 flags make float32 products oneDNN's bfloat16 ones, which the eager
            # path turns off around its call (``plain``: attention at decoding sizes ran 3 to 10
            # times as long with them), compiled code cannot turn them off: a float32 choice
            # computes in bfloat16 there (a float16 GPT's attention, 16 x 4 x 64 x 64 causal:
            # 2.2 ms a call in float32 under the flags, 1.0 in bfloat16, 0.75 in plain float32).
            if dtype is torch.float32 and plain is not None and not float32_only:
                choice, dtype = BFLOAT16, torch.bfloat16
            count(reported, _BECAME[choice])
            return _computed_as_captured(original, dtype, args, kwargs, in_place)
        computed = plain if plain is not None and dtype is torch.float32 else original
        if graph.capturing_here():
            count(reported, _BECAME[choice])
            return _computed_as_captured(computed, dtype, args, kwargs, in_place)
        if in_place:
            count(reported, _BECAME[choice])
            return _written_in_place(computed, dtype, cache, args, kwargs)
        out = kwargs.get("out")
        if out is not None:
            return _written_to_out(computed, dtype, cache, args, kwargs, count, reported, choice)
        count(reported, _BECAME[choice])
        if not (torch.is_grad_enabled() and _recording(tensors)):
            if on_packed is not None and dtype is torch.bfloat16:
                result = on_packed(computed, at_once, cache, args, kwargs)
                if result is not NotImplemented:
                    return result
            result = at_once(computed, dtype, cache, args, kwargs)
            if result is not NotImplemented:
                return result
        return _computed_and_rounded(computed, dtype, cache, args, kwargs, tensors)

    @functools.wraps(original)
    def computed_by_policy(*args, **kwargs):
        if len(args) <= first and kwargs:              # F.linear(input=x, weight=w)
            args, kwargs = by_position(original, first + 1, args, kwargs)
        # One dtype check: the leading tensor's (einsum's first operand, after the equation).
        leading = args[first] if len(args) > first else None
        if leading.__class__ in (list, tuple) and leading:
            leading = leading[0]
        # isinstance, not getattr with a default: dynamo before torch 2.5 cannot trace that
        if isinstance(leading, torch.Tensor) and leading.dtype is HALF:
            return widened(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        except RuntimeError:                           # mixed dtypes: torch refused them
            if not regions.depth:
                raise
        return reconciled(*args, **kwargs)

    if compiled is None:
        return computed_by_policy
    # Calls outside float16, nearly all of them where the policy widens, skip the Python frame;
    # a call naming its leading tensor by keyword takes it.
    gate = compiled.HalfGate(original, widened, reconciled, regions, HALF, first, computed_by_policy)
    return compiled_twin(gate, computed_by_policy)


def _traced(tensors) -> bool:
    """Whether torch.compile traces this call: dynamo tracing it, or a call on its fake tensors
    (torch before 2.5 runs an nn.Module's call on them, not knowing it compiles), or on another
    tensor subclass, whose memory the policy's kept buffers and compiled conversions cannot read."""
    if torch.compiler.is_compiling():
        return True
    for tensor in tensors:
        if tensor.__class__ not in _PLAIN:
            return True
    return False


def _in_plain_float32(original):
    """``original`` with the target's float32 matmuls in plain float32 (oneDNN's float32
    precision "ieee") for the call, the setting put back as it was after. The setting is the
    process's, not the thread's: another thread's float32 matmul running meanwhile runs in plain
    float32 too."""
    matmul = torch.backends.mkldnn.matmul

    @functools.wraps(original)
    def in_plain_float32(*args, **kwargs):
        before = matmul.fp32_precision
        matmul.fp32_precision = "ieee"
        try:
            return original(*args, **kwargs)
        finally:
            matmul.fp32_precision = before
    return in_plain_float32


def _at_once(original, dtype, cache, args, kwargs):
    """``_computed_and_rounded(original, dtype, ...)`` in one frame, for the call nearly every
    float16 model makes in inference: no gradient recorded, and positional operands that are
    parameters with a kept copy, plain host tensors, or views split off one projection; no
    tensor among the keywords. The same kept copies, buffers, conversions and rounding as the
    general path. Its thirty-odd frames cost a 4-block GPT generation about 40 us a call where
    the program's own products have just taken the caches, four times what they cost timed
    alone. A convolution's sizes (``stride=(2, 2)``, a pooling's kernel) are values like any
    other; a list or tuple holding a tensor (einsum's operands) is handed on. NotImplemented,
    with nothing converted, for any other call."""
    for value in kwargs.values():
        if isinstance(value, torch.Tensor) or _holds_a_tensor(value):
            return NotImplemented
    reduced = dtype is torch.bfloat16 and native.usable()     # the compiled conversion runs
    copies, wide, plain, bases = cache.copies, list(args), [], False
    for index, value in enumerate(args):
        kind = value.__class__
        if kind is torch.nn.Parameter:
            kept = copies.get((id(value), dtype))
            if kept is None or kept[0]() is not value or kept[1] != value._version \
                    or kept[2]() is not value.untyped_storage():
                return NotImplemented                   # widened and kept by the general path
            wide[index] = kept[3]
        elif kind is torch.Tensor:
            if not value.is_cpu or value.is_nested or value.layout is not torch.strided:
                return NotImplemented
            plain.append(index)
            bases = bases or value._base is not None
        elif isinstance(value, torch.Tensor) or _holds_a_tensor(value):
            return NotImplemented
    scratch = _SCRATCH
    lent = len(scratch.lent)
    result = ()
    try:
        together = _converted_together([args[index] for index in plain], dtype, scratch) \
            if bases else None
        for index in plain:
            value = args[index]
            if together and id(value) in together:
                wide[index] = together[id(value)]
            elif native.dense(value):
                buffer = scratch._borrowed(value.numel() * dtype.itemsize, dtype, value.size(),
                                           value.stride())
                if not (reduced and native.converted_into(value, buffer, dtype)):
                    # by way of float32, as ``converted`` goes: torch converts float16 to
                    # bfloat16 element by element
                    buffer.copy_(value.float() if dtype is torch.bfloat16 else value)
                wide[index] = buffer
            else:
                wide[index] = scratch.converted(value, dtype)
        result = original(*wide, **kwargs)
    finally:
        scratch.given_back(lent, result)
    if reduced and result.__class__ is torch.Tensor and result.dtype is torch.bfloat16 \
            and native.dense(result) and not result.is_nested:
        operands = _operand_storages(wide)
        if operands is not None and result.untyped_storage().data_ptr() not in operands \
                and native.converted_into(result, result, HALF):
            return result.view(HALF)
    return _to_half(result, _operand_storages(wide) if reduced else None)


class PackedForm(NamedTuple):
    """A call computed as a linear layer on a weight packed for oneDNN (``kernels.packed_linear``)."""
    operands: Callable        # (args, kwargs) -> (input, weight, bias), or None: not this form
    computed: Callable        # the call's own arguments, the weight packed -> its bfloat16 result
    transposed: bool          # the weight is laid out in x out (packed as its transpose)


def _linear_operands(args, kwargs):
    if len(args) + len(kwargs) > 3 or not kwargs.keys() <= {"input", "weight", "bias"}:
        return None
    return (args[0] if args else kwargs.get("input"), args[1] if len(args) > 1 else kwargs.get("weight"),
            args[2] if len(args) > 2 else kwargs.get("bias"))


def _addmm_operands(args, kwargs):
    """``torch.addmm(bias, input, weight)`` unscaled, adding a row (Hugging Face's Conv1D, the
    layers of GPT-2 and its kin, whose weight is laid out in x out)."""
    if len(args) != 3 or kwargs or getattr(args[0], "ndim", None) != 1:
        return None
    bias, x, weight = args
    return x, weight, bias


# (owner, name) -> how the call is computed on a packed weight
_PACKED_FORMS = {
    (F, "linear"): PackedForm(
        _linear_operands, lambda input, weight, bias=None: packed_linear.linear(input, weight, bias), False),
    (torch, "addmm"): PackedForm(
        _addmm_operands, lambda bias, input, weight: packed_linear.linear(input, weight, bias), True),
}


def _on_packed_weight_of(owner, name):
    """How a float16 call of ``owner.name`` is computed in bfloat16 on its weight kept packed
    for oneDNN: ``(original, at_once, cache, args, kwargs) -> result``, NotImplemented where it
    is not (``original``, torch's own function, is what a convolution's packed form is timed
    against); None for a function that has no such form."""
    form = _PACKED_FORMS.get((owner, name))
    if form is not None:
        return functools.partial(_on_packed_weight, form)
    if owner is torch and name in _PACKED_FUSED_LAYERS:
        return _PACKED_FUSED_LAYERS[name]
    if (owner, name) in _PACKED_TRANSPOSED_CONVOLUTIONS:
        return _on_packed_transposed_convolution
    return _on_packed_convolution if (owner, name) in _PACKED_CONVOLUTIONS else None


def _on_packed_weight(form, original, at_once, cache, args, kwargs):
    """A float16 call of ``form`` computed in bfloat16 on its weight packed for oneDNN and kept
    (``WideningCache.packed_weight``: torch's bfloat16 linear without reordering the weight at
    every call), rounded to float16 once, in one frame where ``at_once`` takes it. NotImplemented,
    with nothing converted, where the weight is not a host parameter kept packed, the input
    not a plain host tensor, packing does not run here, or torch.compile or a JIT trace records
    the call (a packed weight is no tensor a graph can hold)."""
    operands = form.operands(args, kwargs)
    if operands is None or operands[1].__class__ is not torch.nn.Parameter or not packed_linear.usable() \
            or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return NotImplemented
    kept = cache.packed_transposed if form.transposed else cache.packed
    result = at_once(form.computed, torch.bfloat16, kept, args, kwargs)
    if result is not NotImplemented:
        return result
    x, weight, bias = operands                  # the layer's first call, or one at_once leaves
    if x.__class__ is not torch.Tensor or not x.is_cpu or x.is_nested or x.layout is not torch.strided \
            or weight.dim() != 2 or not weight.is_cpu or weight.layout is not torch.strided \
            or (bias is not None and (bias.__class__ not in _PLAIN or not bias.is_cpu
                                      or bias.layout is not torch.strided)):
        return NotImplemented
    packed = cache.packed_weight(weight, form.transposed)
    if packed is None:
        return NotImplemented
    if bias is not None:
        bias = cache.widen(bias, torch.bfloat16, copies=kept.copies)
    scratch = _SCRATCH
    lent = scratch.lending()
    result = ()
    try:
        result = packed_linear.linear(scratch.converted(x, torch.bfloat16), packed, bias)
    finally:
        scratch.given_back(lent, result)
    return _to_half(result, frozenset())          # a result of its own: rounded where it lies


_PACKED_CONVOLUTIONS = frozenset({(owner, name) for owner in (F, torch) for name in ("conv1d", "conv2d", "conv3d")})
_CONVOLUTION_PARAMETERS = ("input", "weight", "bias", "stride", "padding", "dilation", "groups")


def _convolution_arguments(args, kwargs):
    """A ``conv1d``, ``conv2d`` or ``conv3d`` call's (input, weight, bias, padding, stride, dilation, groups),
    the sizes as lists of one per spatial dimension (the weight's), or None where the packed path
    leaves it to torch: padding "same" that torch pads unevenly (or with a stride, which torch
    refuses), a size that is no integer or tuple of them."""
    if len(args) > len(_CONVOLUTION_PARAMETERS) \
            or not kwargs.keys() <= set(_CONVOLUTION_PARAMETERS[len(args):]):
        return None
    given = dict(zip(_CONVOLUTION_PARAMETERS, args), **kwargs)
    x, weight = given.get("input"), given.get("weight")
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (3, 4, 5):
        return None
    dimensions = weight.dim() - 2
    sizes = []
    for name, default in (("stride", 1), ("dilation", 1), ("padding", 0)):
        value = given.get(name, default)
        if isinstance(value, str):
            sizes.append(value)
            continue
        each = [value] * dimensions if isinstance(value, int) else list(value)
        if len(each) != dimensions or not all(type(size) is int for size in each):
            return None
        sizes.append(each)
    stride, dilation, padding = sizes
    if padding == "valid":
        padding = [0] * dimensions
    elif padding == "same":
        spans = [step * (size - 1) for step, size in zip(dilation, weight.shape[2:])]
        if stride != [1] * dimensions or any(span % 2 for span in spans):
            return None
        padding = [span // 2 for span in spans]
    groups = given.get("groups", 1)
    if isinstance(stride, str) or isinstance(padding, str) or type(groups) is not int:
        return None
    return x, weight, given.get("bias"), padding, stride, dilation, groups


def _on_packed_convolution(original, at_once, cache, args, kwargs):
    """A float16 ``conv2d``, ``conv3d`` or ``conv1d`` computed in bfloat16 on its weight packed for
    oneDNN's channels-last kernels and kept (``WideningCache.packed_convolution_weight``), the input
    converted and laid out channels-last in one pass, the result converted back in the layout CUDA
    returns (``kernels.packed_convolution``; a conv1d is a conv2d of height one, its result
    contiguous, as cuDNN returns a 1-D convolution's). NotImplemented, with nothing converted,
    where the weight is not a host parameter kept packed, the input is not a dense batched host
    tensor, the call is one torch would refuse, packing does not run here, or torch.compile or a
    JIT trace records the call."""
    arguments = _convolution_arguments(args, kwargs)
    if arguments is None:
        return NotImplemented
    x, weight, bias, padding, stride, dilation, groups = arguments
    if weight.__class__ is not torch.nn.Parameter or x.__class__ is not torch.Tensor or x.dim() != weight.dim() \
            or x.dtype is not HALF or weight.dtype is not HALF or not x.is_cpu or not weight.is_cpu \
            or x.layout is not torch.strided or weight.layout is not torch.strided or not x.numel() \
            or x.shape[1] != weight.shape[1] * groups or groups < 1 or weight.shape[0] % groups \
            or (bias is not None and (bias.__class__ not in _PLAIN or bias.dtype is not HALF
                                      or not bias.is_cpu or bias.shape != weight.shape[:1])):
        return NotImplemented
    for size, kernel, pad, step, spacing in zip(x.shape[2:], weight.shape[2:], padding, stride, dilation):
        if step < 1 or spacing < 1 or pad < 0 or size + 2 * pad < spacing * (kernel - 1) + 1:
            return NotImplemented                   # torch's own message for what it refuses
    one_dimensional = x.dim() == 3
    if one_dimensional:                             # a conv2d of height one
        x, weight_layout = x.unsqueeze(2), packed_convolution.laid_out(weight.unsqueeze(2))
        padding, stride, dilation = [0, *padding], [1, *stride], [1, *dilation]
    else:
        weight_layout = packed_convolution.laid_out(weight)
    input_layout = packed_convolution.laid_out(x)
    usable = packed_convolution.volumetric_usable if x.dim() == 5 else packed_convolution.usable
    if input_layout is None or weight_layout is None or not usable() \
            or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return NotImplemented

    def on_packed_weight():
        packed = cache.packed_convolution_weight(weight, (padding, stride, dilation, groups), list(x.shape))
        if packed is None:
            return NotImplemented
        wide_bias = None if bias is None \
            else cache.widen(bias, torch.bfloat16, copies=cache.packed_convolutions.copies)
        return _on_scratch(x, lambda borrowed: packed_convolution.convolution(
            x, packed, wide_bias, padding, stride, dilation, groups,
            not one_dimensional and (input_layout or weight_layout), borrowed, squeezed=one_dimensional))
    kind = ("convolution", tuple(weight.shape), tuple(padding), tuple(stride), tuple(dilation), groups,
            input_layout, weight_layout, _size_class(x))
    return _on_the_faster_form(kind, on_packed_weight, (weight, bias), original, at_once, cache, args, kwargs)


def _on_scratch(x, compute):
    """``compute(borrowed)``, ``borrowed(sizes, strides)`` lending one of the thread's kept
    bfloat16 buffers for ``x`` converted, given back once the result is made; NotImplemented
    where ``compute`` answers None (the compiled conversions do not run here)."""
    scratch = _SCRATCH
    lent = scratch.lending()
    result = ()
    try:
        result = compute(lambda sizes, strides: scratch._borrowed(x.numel() * 2, torch.bfloat16, sizes, strides))
    finally:
        scratch.given_back(lent, result)
    return NotImplemented if result is None else result


# torch.conv_transpose1d/2d/3d are not replaced by the policy (nn.ConvTranspose1d/2d/3d call the
# functionals).
_PACKED_TRANSPOSED_CONVOLUTIONS = frozenset(
    {(F, name) for name in ("conv_transpose1d", "conv_transpose2d", "conv_transpose3d")})
_TRANSPOSED_CONVOLUTION_PARAMETERS = ("input", "weight", "bias", "stride", "padding", "output_padding",
                                      "groups", "dilation")


def _transposed_convolution_arguments(args, kwargs):
    """A batched ``conv_transpose1d``, ``conv_transpose2d`` or ``conv_transpose3d`` call's (input,
    weight, bias, padding, output_padding, stride, dilation, groups), the sizes as lists of one per
    spatial dimension (the weight's), or None where a size is no integer or tuple of them, the
    input is unbatched, or the call is one torch would refuse (its own message then)."""
    if len(args) > len(_TRANSPOSED_CONVOLUTION_PARAMETERS) \
            or not kwargs.keys() <= set(_TRANSPOSED_CONVOLUTION_PARAMETERS[len(args):]):
        return None
    given = dict(zip(_TRANSPOSED_CONVOLUTION_PARAMETERS, args), **kwargs)
    x, weight = given.get("input"), given.get("weight")
    if not isinstance(weight, torch.Tensor) or weight.dim() not in (3, 4, 5) or not isinstance(x, torch.Tensor) \
            or x.dim() != weight.dim():
        return None
    dimensions = weight.dim() - 2
    sizes = []
    for name, default in (("padding", 0), ("output_padding", 0), ("stride", 1), ("dilation", 1)):
        value = given.get(name, default)
        each = [value] * dimensions if type(value) is int \
            else list(value) if isinstance(value, (tuple, list)) else None
        if each is None or len(each) != dimensions or not all(type(size) is int for size in each):
            return None
        sizes.append(each)
    padding, output_padding, stride, dilation = sizes
    groups = given.get("groups", 1)
    if type(groups) is not int or groups < 1 or weight.shape[0] % groups or x.shape[1] != weight.shape[0]:
        return None
    for size, kernel, pad, extra, step, spacing in zip(x.shape[2:], weight.shape[2:], padding, output_padding,
                                                        stride, dilation):
        if step < 1 or spacing < 1 or pad < 0 or extra < 0 or (extra >= step and extra >= spacing) \
                or (size - 1) * step - 2 * pad + spacing * (kernel - 1) + extra + 1 < 1:
            return None
    return x, weight, given.get("bias"), padding, output_padding, stride, dilation, groups


def _on_packed_transposed_convolution(original, at_once, cache, args, kwargs):
    """A float16 ``conv_transpose2d`` or ``conv_transpose3d`` computed in bfloat16 on its weight
    packed for oneDNN's channels-last kernels and kept, as ``_on_packed_convolution`` computes a
    ``conv2d`` (``kernels.packed_convolution.convolution_transposed``); a ``conv_transpose1d`` as
    one of height one, its result contiguous, as ``_on_packed_convolution`` computes a ``conv1d``.
    NotImplemented, with nothing converted, where that leaves a convolution to the general path,
    or a size is not one integer per spatial dimension."""
    arguments = _transposed_convolution_arguments(args, kwargs)
    if arguments is None:
        return NotImplemented
    x, weight, bias, padding, output_padding, stride, dilation, groups = arguments
    if weight.__class__ is not torch.nn.Parameter or x.__class__ is not torch.Tensor \
            or x.dtype is not HALF or weight.dtype is not HALF or not x.is_cpu or not weight.is_cpu \
            or x.layout is not torch.strided or weight.layout is not torch.strided or not x.numel() \
            or (bias is not None and (bias.__class__ not in _PLAIN or bias.dtype is not HALF or not bias.is_cpu
                                      or bias.shape != (weight.shape[1] * groups,))):
        return NotImplemented
    one_dimensional = x.dim() == 3
    if one_dimensional:                             # a conv_transpose2d of height one
        x, weight_layout = x.unsqueeze(2), packed_convolution.laid_out(weight.unsqueeze(2))
        padding, output_padding, stride, dilation = [0, *padding], [0, *output_padding], [1, *stride], \
            [1, *dilation]
    else:
        weight_layout = packed_convolution.laid_out(weight)
    input_layout = packed_convolution.laid_out(x)
    usable = packed_convolution.volumetric_transposed_usable if x.dim() == 5 \
        else packed_convolution.transposed_usable
    if input_layout is None or weight_layout is None or not usable() \
            or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return NotImplemented

    def on_packed_weight():
        packed = cache.packed_convolution_weight(weight, (padding, output_padding, stride, dilation, groups),
                                                 list(x.shape), packed_convolution.pack_transposed)
        if packed is None:
            return NotImplemented
        wide_bias = None if bias is None \
            else cache.widen(bias, torch.bfloat16, copies=cache.packed_convolutions.copies)
        return _on_scratch(x, lambda borrowed: packed_convolution.convolution_transposed(
            x, packed, wide_bias, padding, output_padding, stride, dilation, groups,
            not one_dimensional and (input_layout or weight_layout), borrowed, squeezed=one_dimensional))
    kind = ("transposed convolution", tuple(weight.shape), tuple(padding), tuple(output_padding), tuple(stride),
            tuple(dilation), groups, input_layout, weight_layout, _size_class(x))
    return _on_the_faster_form(kind, on_packed_weight, (weight, bias), original, at_once, cache, args, kwargs)


# Which convolutions run faster on packed weights than as torch's own bfloat16 convolution on
# plain copies, by kind, timed at each kind's first call. On an AVX512-BF16 EPYC without AMX,
# in one float16 convnet, packed over plain: a 3-channel stem 1.30-1.44, 32 -> 64 channels 0.86-0.90,
# the deeper layers 0.93-1.06; a ViT's 16 x 16 patch embedding 1.93. Packing was adopted on a Xeon
# with AMX-BF16, where the whole convnet ran 0.98x its bfloat16 port packed, 1.12x plain.
_PACKED_OR_PLAIN = timing.FasterAtFirstCall()


def _size_class(x) -> int:
    """The class of input sizes a convolution's choice is timed for: its positions over the batch,
    to the power of two (a program whose sizes vary, variable-length audio, detection at many
    image sizes, times a few classes, not every size)."""
    return (x.numel() // x.shape[1]).bit_length()


def _on_the_faster_form(kind, on_packed_weight, parameters, original, at_once, cache, args, kwargs):
    """``on_packed_weight()`` where this kind of convolution runs faster on its packed weight, else
    NotImplemented (the general path's torch's own bfloat16 convolution on plain copies), as
    timed at the kind's first call (``_PACKED_OR_PLAIN``); once chosen, only the copies the
    chosen form reads of ``parameters`` (weight and bias) are kept."""
    chosen = _PACKED_OR_PLAIN.chosen.get(kind)
    if chosen is not None:
        return on_packed_weight() if chosen == 0 else NotImplemented

    def on_plain_copies():
        result = at_once(original, torch.bfloat16, cache, args, kwargs)
        return _computed_and_rounded(original, torch.bfloat16, cache, args, kwargs) \
            if result is NotImplemented else result
    return _PACKED_OR_PLAIN.timed(kind, on_packed_weight, on_plain_copies,
                                  lambda index: cache.keep_copies_of_one_form(parameters, packed=index == 0))


_ENCODER_LAYER_PARAMETERS = (
    "src", "embed_dim", "num_heads", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias", "use_gelu",
    "norm_first", "eps", "norm_weight_1", "norm_bias_1", "norm_weight_2", "norm_bias_2", "ffn_weight_1",
    "ffn_bias_1", "ffn_weight_2", "ffn_bias_2", "mask", "mask_type")
_ATTENTION_PARAMETERS = (
    "query", "key", "value", "embed_dim", "num_head", "qkv_weight", "qkv_bias", "proj_weight", "proj_bias",
    "mask", "need_weights", "average_attn_weights", "mask_type")


def _fused_layer_arguments(parameters, required, args, kwargs):
    """A fused layer's call as {parameter: value}, or None where it is no call of ``parameters``
    with at least ``required`` of them."""
    if len(args) > len(parameters) or not kwargs.keys() <= set(parameters[len(args):]):
        return None
    given = dict(zip(parameters, args), **kwargs)
    return given if len(given) >= required else None


def _packed_layer(cache, batch, width, heads, weights, vectors, mask, mask_type):
    """What a fused layer computed op by op reads: (the batch's ``Tokens``, its tokens in
    bfloat16, the weights packed and kept, the vectors in bfloat16 and kept, attention's mask),
    or None, with nothing converted, where it cannot be computed so: ``batch`` is no float16 host
    tensor in either form, a weight ((parameter, shape) pairs) no host float16 parameter, a vector
    ((tensor, size) pairs) no host float16 vector, the mask one the fused call reads otherwise,
    packing does not run here, or torch.compile or a JIT trace records the call."""
    if batch.__class__ is not torch.Tensor or batch.dtype is not HALF or not batch.is_cpu \
            or type(width) is not int or type(heads) is not int or heads < 1 or width % heads \
            or not packed_encoder_layer.usable() or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return None
    for weight, shape in weights:
        if weight.__class__ is not torch.nn.Parameter or weight.dtype is not HALF or not weight.is_cpu \
                or weight.layout is not torch.strided or tuple(weight.shape) != shape:
            return None
    for vector, size in vectors:
        if vector.__class__ not in _PLAIN or vector.dtype is not HALF or not vector.is_cpu \
                or vector.layout is not torch.strided or tuple(vector.shape) != (size,):
            return None
    tokens = packed_encoder_layer.tokens_of(batch)
    if tokens is None or tokens.matrix.shape[1] != width or not tokens.matrix.numel():
        return None
    try:
        attends = packed_encoder_layer.attention_mask(mask, mask_type, tokens, heads)
    except ValueError:
        return None
    packed = [cache.packed_weight(weight) for weight, _ in weights]
    if any(weight is None for weight in packed):
        return None
    kept = [cache.widen(vector, torch.bfloat16, copies=cache.packed.copies) for vector, _ in vectors]
    return tokens, converted(tokens.matrix, torch.bfloat16), packed, kept, attends


def _on_packed_encoder_layer(original, at_once, cache, args, kwargs):
    """A float16 ``torch._transformer_encoder_layer_fwd`` (nn.TransformerEncoderLayer's fused
    inference path) computed in bfloat16 op by op, its four products on their weights packed for
    oneDNN and kept, a nested batch's tokens as one matrix (``kernels.packed_encoder_layer``), its
    result rounded to float16 once, in the form the fused call returns. NotImplemented, with
    nothing converted, where ``_packed_layer`` cannot take it."""
    given = _fused_layer_arguments(_ENCODER_LAYER_PARAMETERS, 18, args, kwargs)
    if given is None or type(given["use_gelu"]) is not bool or type(given["norm_first"]) is not bool:
        return NotImplemented
    width, ffn_weight_1 = given["embed_dim"], given["ffn_weight_1"]
    hidden = ffn_weight_1.shape[0] if isinstance(ffn_weight_1, torch.Tensor) and ffn_weight_1.dim() == 2 else 0
    layer = _packed_layer(
        cache, given["src"], width, given["num_heads"],
        list(zip([given[name] for name in ("qkv_weight", "proj_weight", "ffn_weight_1", "ffn_weight_2")],
                 ((3 * width, width), (width, width), (hidden, width), (width, hidden)))),
        list(zip([given[name] for name in ("qkv_bias", "proj_bias", "ffn_bias_1", "ffn_bias_2", "norm_weight_1",
                                           "norm_bias_1", "norm_weight_2", "norm_bias_2")],
                 (3 * width, width, hidden, width, width, width, width, width))),
        given.get("mask"), given.get("mask_type"))
    if layer is None:
        return NotImplemented
    tokens, x, packed, kept, attends = layer
    result = packed_encoder_layer.encoder_layer(
        x, tokens, given["num_heads"], *zip(packed, kept[:4]), tuple(kept[4:6]), tuple(kept[6:]),
        use_gelu=given["use_gelu"], norm_first=given["norm_first"], eps=given["eps"], attends=attends)
    return tokens.rebuilt(_to_half(result, frozenset()))     # a result of its own: rounded where it lies


def _on_packed_attention(original, at_once, cache, args, kwargs):
    """A float16 ``torch._native_multi_head_attention`` (nn.MultiheadAttention's fused inference
    path, self-attention) computed in bfloat16 op by op as an encoder layer's attention is
    (``_on_packed_encoder_layer``), with the attention weights where it is asked for them (averaged
    over the heads or not), rounded to float16 once each. NotImplemented where query, key and value
    are not one tensor, or weights are asked of a nested batch, or ``_packed_layer`` cannot take it."""
    given = _fused_layer_arguments(_ATTENTION_PARAMETERS, 9, args, kwargs)
    if given is None or not given["query"] is given["key"] is given["value"]:
        return NotImplemented
    need_weights, average = given.get("need_weights", True), given.get("average_attn_weights", True)
    if type(need_weights) is not bool or type(average) is not bool \
            or (need_weights and given["query"].is_nested):
        return NotImplemented
    width = given["embed_dim"]
    layer = _packed_layer(
        cache, given["query"], width, given["num_head"],
        [(given["qkv_weight"], (3 * width, width)), (given["proj_weight"], (width, width))],
        [(given["qkv_bias"], 3 * width), (given["proj_bias"], width)], given.get("mask"), given.get("mask_type"))
    if layer is None:
        return NotImplemented
    tokens, x, packed, kept, attends = layer
    result, weights = packed_encoder_layer.self_attention(
        x, tokens, given["num_head"], *zip(packed, kept), attends,
        weights="averaged" if need_weights and average else "each head" if need_weights else None)
    return (tokens.rebuilt(_to_half(result, frozenset())),
            None if weights is None else _to_half(weights, frozenset()))


# torch's fused layers computed op by op on packed weights, by name
_PACKED_FUSED_LAYERS = {"_transformer_encoder_layer_fwd": _on_packed_encoder_layer,
                        "_native_multi_head_attention": _on_packed_attention}


def _holds_a_tensor(value) -> bool:
    """Whether ``value`` is a list or tuple with a tensor among its items, at any depth."""
    return isinstance(value, (list, tuple)) and any(
        isinstance(item, torch.Tensor) or _holds_a_tensor(item) for item in value)


def _at_once_for(compiled, python=_at_once):
    """``_at_once``, or its compiled twin where the fast path runs (``_speedups_at_once.c``),
    which takes the calls of one tensor and kept weights (a layer's projection) whole and
    hands the rest to ``python`` (``_at_once``). torch.compile traces the twin."""
    if compiled is None:
        return python
    convert = native._native.convert_reduced if native._native is not None else None
    twin = compiled.AtOnce(python, _SCRATCH, native.usable, convert, torch.get_num_threads,
                           native._CONVERSION_ELEMENTS_PER_THREAD, _to_half, torch.nn.Parameter,
                           torch.Tensor, HALF, torch.bfloat16, torch.strided)
    return compiled_twin(twin, python)


# What a float16 call computed by a choice became, for the report.
_BECAME = {choice: f"float16 computed in {choice}" for choice in (BFLOAT16, FLOAT32)}


def _written_in_place(method, dtype, cache, args, kwargs):
    """``target.method(...)`` (``addmm_`` and its kin) computed in ``dtype`` on a copy of
    ``target`` of its own (a kept copy of a parameter is never written), whose result is
    rounded into ``target`` once."""
    target, *operands = args
    wide, _, _ = _called_wide(method, dtype, cache, [converted(target, dtype), *operands], kwargs)
    return _rounded_into(target, wide)


def _written_to_out(function, dtype, cache, args, kwargs, count, reported, choice):
    """``function(..., out=out)`` computed in ``dtype`` and rounded into ``out``, which it
    returns, as torch does. Where torch would refuse the call (gradients recorded through an
    ``out=`` call), torch computes it as asked, and refuses it."""
    out = kwargs["out"]
    if not isinstance(out, torch.Tensor) or _recording(_floating((*args, *kwargs.values()))):
        return function(*args, **kwargs)
    count(reported, f"float16 computed in {choice}")
    result, _, _ = _called_wide(function, dtype, cache, args,
                                {name: value for name, value in kwargs.items() if name != "out"})
    if result.shape != out.shape:
        return written_to(out, converted(result, out.dtype))      # resized, as torch does
    return _rounded_into(out, result)


def _computed_as_captured(original, dtype, args, kwargs, in_place):
    """``original`` computed in ``dtype`` and rounded to float16, every step a torch op, for a
    call a CUDA graph's capture records (``graphs.recording``): a replay runs only the ops
    recorded, so the compiled conversions (which are no ops), kept copies of weights (a weight
    written between replays would not reach them) and kept buffers (lent to other calls between
    replays) are left out. Operands are converted at every replay. ``in_place``: ``original`` is
    a Tensor method writing into the tensor it is called on."""
    def wide(value):
        if isinstance(value, torch.Tensor):
            return value.to(dtype) if value.dtype is HALF else value
        if isinstance(value, (list, tuple)):
            return type(value)(wide(item) for item in value)
        return value
    out = kwargs.get("out")
    result = original(*[wide(value) for value in args],
                      **{name: wide(value) for name, value in kwargs.items() if name != "out"})
    if in_place:
        return args[0].copy_(result)
    if isinstance(out, torch.Tensor):
        return out.copy_(result) if out.shape == result.shape else written_to(out, result.to(out.dtype))
    if isinstance(result, tuple):
        return tuple(item.to(HALF) if isinstance(item, torch.Tensor) and item.dtype is dtype else item
                     for item in result)
    return result.to(HALF) if isinstance(result, torch.Tensor) and result.dtype is dtype else result


def _rounded_into(target, wide):
    """``wide`` rounded into ``target`` (of its sizes) once: in one compiled pass where both are
    laid out alike and no gradient is recorded through ``target``."""
    if wide.stride() == target.stride() and native.usable() and native.dense(target) \
            and not (target.requires_grad and torch.is_grad_enabled()) \
            and native.reduced_converted(wide, target.dtype, target) is not None:
        return target
    return target.copy_(converted(wide, target.dtype))


class _NoRegion:
    """The float32 regions of a function outside the matmul family: none (mixed dtypes there
    are torch's to judge)."""
    depth = 0


def by_measurement(api, device_type, cache, count, compiled, original, *, at_once=None, up_to=None,
                   only_when=None):
    """``original``, an op outside the matmul family that this host computes faster in float32
    than in float16 (measured: ``tables/float16_ops.py``), on float16 inputs widened to float32
    and its result rounded to float16 once, on inputs of at most ``up_to`` elements (None: any
    size) where larger ones were timed faster as asked, and only in the calls ``only_when(args,
    kwargs)`` accepts where it is given (the calls like the one timed). A call asking for an
    output dtype, inside an autocast region, or with other dtypes among its inputs goes to torch
    as it is."""
    at_once = _at_once if at_once is None else at_once
    def widened(*args, **kwargs):
        tensors = _floating((*args, *kwargs.values()) if kwargs else args)
        if torch.is_autocast_enabled(device_type) or kwargs.get("dtype") is not None \
                or any(value.__class__ is torch.dtype for value in args) or not _all_half(tensors):
            return original(*args, **kwargs)
        if only_when is not None and not only_when(args, kwargs):
            count(api, "float16 as asked (a kind of call faster so: see tables/float16_ops.py)")
            return original(*args, **kwargs)
        if _traced(tensors) or graph.capturing_here():
            # as asked: see _computed_as_captured; a compiled kernel computes float16 in float32
            return original(*args, **kwargs)
        if up_to is not None and tensors[0].numel() > up_to:
            count(api, "float16 as asked (larger than float32 was timed faster at here)")
            return original(*args, **kwargs)
        if kwargs.get("out") is not None:               # torch.pow(x, 3, out=y)
            return _written_to_out(original, torch.float32, cache, args, kwargs, count, api,
                                   "float32 (measured faster here)")
        count(api, "float16 computed in float32 (measured faster here)")
        if not _recording(tensors):
            result = at_once(original, torch.float32, cache, args, kwargs)
            if result is not NotImplemented:
                return result
        return _computed_and_rounded(original, torch.float32, cache, args, kwargs, tensors)

    @functools.wraps(original)
    def computed_by_measurement(*args, **kwargs):
        if not args and kwargs:                        # F.softmax(input=x, dim=-1)
            args, kwargs = by_position(original, 1, args, kwargs)
        if args and isinstance(args[0], torch.Tensor) and args[0].dtype is HALF:
            return widened(*args, **kwargs)
        return original(*args, **kwargs)

    if compiled is None:
        return computed_by_measurement
    gate = compiled.HalfGate(original, widened, original, _NoRegion(), HALF, 0, computed_by_measurement)
    return compiled_twin(gate, computed_by_measurement)


def _floating(values) -> list:
    """The floating-point tensors among ``values``, in order: a list, built in one pass (every
    wrapped call walks its operands, and a generator costs a frame per step)."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                found.append(value)
        elif isinstance(value, (list, tuple)):          # einsum's operands as one list
            found += _floating(value)
    return found


def _computed_and_rounded(original, dtype, cache, args, kwargs, tensors=None):
    """``original`` computed on its float16 operands in ``dtype``, its result rounded to float16
    once, where it lies if it is a bfloat16 result of its own. ``tensors``: the call's floating
    tensors, where the caller has them."""
    result, args, kwargs = _called_wide(original, dtype, cache, args, kwargs, tensors)
    if dtype is not torch.bfloat16:
        return _to_half(result)
    return _to_half(result, _operand_storages((*args, *kwargs.values()) if kwargs else args))


def _operand_storages(values):
    """The data pointers of the storages of the tensors among a call's operands (``_storages``
    of them, in one pass where no list of operands is among them); None where one has none. A
    weight packed for oneDNN holds no memory a result could share (and asking its storage
    raises, at the cost of a C++ exception's stack trace)."""
    found = set()
    try:
        for value in values:
            if isinstance(value, torch.Tensor):
                if not value.is_mkldnn:
                    found.add(value.untyped_storage().data_ptr())
            elif isinstance(value, (list, tuple)):         # einsum's operands as one list
                return _storages(_floating(values))
    except (RuntimeError, NotImplementedError):
        return None
    return found


def _called_wide(original, dtype, cache, args, kwargs, tensors=None):
    """``original`` called on its float16 operands converted to ``dtype``: (its result, and the
    operands it was given). Where the call records no gradient (none is recorded, or no operand
    requires one) they are converted into this thread's kept buffers: the call then allocates
    no more than torch's own would. ``tensors``: the call's floating tensors, where the caller
    has them."""
    if tensors is None:
        tensors = _floating((*args, *kwargs.values()))
    scratch = None if _recording(tensors) else _SCRATCH
    lent = scratch.lending() if scratch is not None else 0
    result = ()
    try:
        together = _converted_together(args, dtype, scratch) if scratch is not None else None
        if together:
            args = [together.get(id(value)) if id(value) in together
                    else _wide(value, cache, dtype, scratch) for value in args]
        else:
            args = [_wide(value, cache, dtype, scratch) for value in args]
        kwargs = {name: _wide(value, cache, dtype, scratch) for name, value in kwargs.items()}
        result = original(*args, **kwargs)
    finally:
        if scratch is not None:
            scratch.given_back(lent, result)
    return result, args, kwargs


def _converted_together(args, dtype, scratch):
    """{id(operand): the operand in ``dtype``} for a call's float16 operands that are all views
    of one dense tensor and together as large as it (q, k and v split off one fused projection),
    else None. That tensor is converted once, and each operand is the same view of the
    conversion, in its own strides: converted one by one, each would be staged densely first."""
    views = [value for value in args if isinstance(value, torch.Tensor) and value._base is not None]
    if len(views) < 2:
        return None
    base = views[0]._base
    if base.dtype is not HALF or not base.is_contiguous() \
            or sum(view.numel() for view in views) != base.numel():
        return None
    start = base.storage_offset()
    for view in views:
        if view._base is not base or view.dtype is not HALF \
                or not start <= view.storage_offset() <= _last_element(view) < start + base.numel():
            return None
    whole = scratch.converted(base, dtype)          # dense: in the base's strides, from offset 0
    return {id(view): whole.as_strided(view.size(), view.stride(), view.storage_offset() - start)
            for view in views}


def _last_element(view) -> int:
    """Where ``view``'s last element lies in its storage (an as_strided view may reach outside
    its base)."""
    return view.storage_offset() + sum((size - 1) * stride for size, stride
                                       in zip(view.size(), view.stride()) if size)


class ConversionScratch(threading.local):
    """Host buffers the policy converts a call's float16 operands into, kept for the next call
    of the same size. A fresh buffer of a few MiB costs a page fault every 4 KiB at its first
    touch, which costs more than the conversion: a convolution over a 4 MiB float16 input took
    1024 more faults and 2.4 ms more than its bfloat16 port on an AVX-512 EPYC, the same as the
    port with these. Each buffer is kept as the tensor last laid over it, and lent again as
    that tensor where a call asks for the same dtype, sizes and strides (a model's layers
    repeat their shapes): a tensor made over a buffer costs more than converting an operand of
    a few KiB. Per thread (DataParallel runs its replicas in threads); lent only where the
    call records no gradient (autograd would save an operand for backward), and left to a result
    that is a view of one (a trivial einsum). At most ``budget`` bytes are kept, those of the
    size least recently given back given up first."""

    budget = 64 << 20

    def __init__(self):
        self.free = {}          # bytes -> [tensors over buffers no call is using]; least recent size first
        self.lent = []          # tensors lent to the calls running now, innermost last
        self.held = 0

    def lending(self) -> int:
        """Where the buffers a call is about to borrow will start in ``lent``."""
        return len(self.lent)

    def converted(self, tensor, dtype):
        """``tensor`` in ``dtype``, in a kept buffer where it is a plain host tensor: in its own
        strides where it is dense, else densely in the order its dimensions lie in memory
        (staged there in its own type first where the compiled conversion runs, which takes
        dense tensors only), so that what the call computes from it is laid out as torch's own
        call would lay it out."""
        if type(tensor) not in _PLAIN or not tensor.is_cpu or tensor.is_nested \
                or tensor.layout is not torch.strided:
            return converted(tensor, dtype)
        nbytes = tensor.numel() * max(dtype.itemsize, tensor.element_size())
        laid_out = native.dense(tensor)
        strides = tensor.stride() if laid_out else native.dense_strides(tensor)
        fast = tensor.dtype in _REDUCED and dtype in _REDUCED and native.usable()
        if fast and not laid_out:
            staged = self._borrowed(nbytes, tensor.dtype, tensor.size(), strides)
            staged.copy_(tensor)
            if native.converted_into(staged, staged, dtype):
                return staged.view(dtype)
        out = self._borrowed(nbytes, dtype, tensor.size(), strides)
        if fast and laid_out and native.converted_into(tensor, out, dtype):
            return out
        out.copy_(tensor.float() if tensor.dtype in _REDUCED and dtype in _REDUCED else tensor)
        return out

    def _borrowed(self, nbytes: int, dtype, sizes, strides):
        """A kept buffer of ``nbytes`` (else a new one) as a tensor of ``dtype``, ``sizes`` and
        ``strides``, lent to the call running now."""
        kept = self.free.get(nbytes)
        if kept:
            buffer = kept.pop()
            self.held -= nbytes
            if not kept:
                del self.free[nbytes]
            if buffer.dtype is not dtype or buffer.stride() != strides or buffer.size() != sizes:
                buffer = torch.empty(0, dtype=dtype, device="cpu").set_(
                    buffer.untyped_storage(), 0, sizes, strides)
        else:
            storage = torch.empty(nbytes, dtype=torch.uint8, device="cpu").untyped_storage()
            buffer = torch.empty(0, dtype=dtype, device="cpu").set_(storage, 0, sizes, strides)
        self.lent.append(buffer)
        return buffer

    def given_back(self, lent: int, result):
        """After the call that borrowed from ``lent`` on: its buffers are kept, but for one its
        result holds."""
        if len(self.lent) == lent:
            return
        borrowed = self.lent[lent:]
        del self.lent[lent:]
        held = _operand_storages(result if isinstance(result, tuple) else (result,))
        for buffer in borrowed:
            if held is not None and buffer.untyped_storage().data_ptr() not in held:
                self._keep(buffer)

    def _keep(self, buffer):
        nbytes = buffer.untyped_storage().nbytes()
        kept = self.free.pop(nbytes, [])
        kept.append(buffer)
        self.free[nbytes] = kept                                      # the most recent size last
        self.held += nbytes
        self._within_budget()

    def _within_budget(self):
        while self.held > self.budget:
            oldest = next(iter(self.free))
            self.held -= oldest
            self.free[oldest].pop(0)
            if not self.free[oldest]:
                del self.free[oldest]

    def clear(self):
        self.free.clear()
        self.held = 0


_SCRATCH = ConversionScratch()


def _storages(tensors):
    """The data pointers of the tensors' storages; None where one has none to tell."""
    try:
        return frozenset(tensor.untyped_storage().data_ptr() for tensor in tensors)
    except (RuntimeError, NotImplementedError):
        return None


def _to_half(result, operands=None):
    """The result in float16, as the call computed in float16 would return it: a tensor, or
    each tensor of the tuple a fused layer returns (multi-head attention's output and weights).
    A bfloat16 result in memory of its own (``operands``: the storages of the tensors the call
    was given; None: not known) is rounded where it lies (``native.reduced_converted_in_place``)."""
    if isinstance(result, tuple):
        tensors = _floating(result)
        if operands is not None and len(_storages(tensors) or ()) < len(tensors):
            operands = None                             # two results in one storage: copied
        return tuple(_to_half(item, operands) for item in result)
    if not isinstance(result, torch.Tensor) or not result.is_floating_point():
        return result
    if operands is not None and result.dtype is torch.bfloat16 and native.usable():
        rounded = native.reduced_converted_in_place(result, HALF, operands)
        if rounded is not None:
            return rounded
    return converted(result, HALF)


def _half_operands(values):
    """The floating-point tensors among ``values`` (``_floating``'s list) where every one is
    float16, else None: the policy's test of every float16 call, in one pass."""
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            if value.is_floating_point():
                if value.dtype is not HALF:
                    return None
                found.append(value)
        elif isinstance(value, (list, tuple)):          # einsum's operands as one list
            inner = _half_operands(value)
            if inner is None:
                return None
            found += inner
    return found


def _all_half(tensors) -> bool:
    for tensor in tensors:
        if tensor.dtype is not HALF:
            return False
    return True


def _recording(tensors) -> bool:
    """Whether autograd records a call on ``tensors``."""
    if torch.is_grad_enabled():
        for tensor in tensors:
            if tensor.requires_grad:
                return True
    return False


def _float32(value, cache):
    """``value`` with its float16 and bfloat16 tensors in float32 (parameters through the cache)."""
    if isinstance(value, torch.Tensor):
        if value.dtype is HALF:
            return cache.widen(value)
        return value.float() if value.dtype is torch.bfloat16 else value
    if isinstance(value, (list, tuple)):
        return type(value)(_float32(item, cache) for item in value)
    return value


def _wide(value, cache, dtype=torch.float32, scratch=None):
    if isinstance(value, torch.Tensor):
        return cache.widen(value, dtype, scratch) if value.dtype is HALF else value
    if isinstance(value, (list, tuple)):
        return type(value)(_wide(item, cache, dtype, scratch) for item in value)
    return value


# --- TF32 ---------------------------------------------------------------------------------
def _map_tf32(activation, reduced: str):
    """The TF32 flags also set oneDNN's float32 precision (``reduced`` when on, as it was
    when off); deactivation puts oneDNN's settings back."""
    mkldnn = torch.backends.mkldnn
    before = {op: getattr(mkldnn, op).fp32_precision for op in ("matmul", "conv")}

    def set_target(op, on):
        getattr(mkldnn, op).fp32_precision = reduced if on else before[op]

    activation.registry.add_undo("oneDNN float32 precision", lambda: [
        set_target(op, False) for op in before])
    def matmul_flag_written(name, value):
        # Turning TF32 on or off also turns the target's reduced-precision matmul on or off.
        if name == "allow_tf32":
            set_target("matmul", bool(value))
        elif name == "fp32_precision":
            set_target("matmul", value == "tf32")

    activation.registry.set_attr(torch.backends.cuda, "matmul",
                                 WatchedAttributes(torch.backends.cuda.matmul, matmul_flag_written))
    cudnn_class = type(torch.backends.cudnn)
    real = vars(cudnn_class)["allow_tf32"]

    def set_allow_tf32(module, value):
        real.__set__(module, value)
        set_target("conv", bool(value))

    activation.registry.set_attr(cudnn_class, "allow_tf32", property(
        lambda module: real.__get__(module, cudnn_class), set_allow_tf32, doc=real.__doc__))

    def make_set_precision(original):
        @functools.wraps(original)
        def set_float32_matmul_precision(precision):
            original(precision)
            set_target("matmul", precision in ("high", "medium"))
        return set_float32_matmul_precision

    activation.replace(torch, "set_float32_matmul_precision", make_set_precision)
