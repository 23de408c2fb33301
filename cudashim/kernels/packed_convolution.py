"""float16 convolutions (1-D, 2-D and 3-D, plain and transposed) computed in bfloat16 on weights
packed once for oneDNN's channels-last kernels.

torch's CPU convolution in bfloat16 is oneDNN's. On a channel-first (NCHW) input, the layout
CUDA programs use, it reorders the weight, and the activation in and out of the layout its
kernels read, at every call. A kept copy of the weight need not be reordered: packed once
(``mkldnn_reorder_conv2d_weight``, the layout torch's own frozen CPU graphs keep), each call is
oneDNN's channels-last kernel (``mkldnn._convolution_pointwise``), with the same values as torch's
bfloat16 convolution. The float16 input is converted to bfloat16 and laid out channels-last in
one pass, and the result converted back to float16 in the layout CUDA would return (channels-last
where the input or the weight is, else channel-first), in one pass (``native.converted_transposed_into``):
torch would take a permuting copy and a conversion for each. On a Xeon with AMX-BF16, paired in
one process, a ResNet-like float16 convnet (batch 16, 64 x 64) ran 0.98-0.99x its bfloat16 port
this way and 1.12-1.14x on plain bfloat16 copies; Hugging Face's ResNet (batch 8, 96 x 96) 1.09x
against 1.24x. An input already channels-last needs no permutation, and gains nothing from the
packing there (1.3-1.5x its port either way: the conversions are what it costs). A transposed
convolution (``conv_transpose2d``) runs the same way on oneDNN's transposed kernels, its weight
packed by ``_reorder_convolution_transpose_weight`` (a DCGAN generator 0.90x its bfloat16 port,
1.10x on plain copies); a 3-D one (``conv3d``) on its 5-D kernels, channels-last in three
dimensions, its weight packed by ``mkldnn_reorder_conv3d_weight``. A 1-D convolution, plain or
transposed, is the 2-D one of height one; a transposed 3-D one (a volumetric U-Net's decoder) the
transposed ops on 5-D tensors. On an AVX512-BF16 EPYC without AMX, a HiFi-GAN-like upsampling
``conv_transpose1d`` (512 -> 256 channels, kernel 16, stride 8, 4 x 64 positions) took 2.9 ms
packed against 6.1 ms as torch's own bfloat16 call on the input converted, a 3-D U-Net's
(64 -> 32 channels, kernel and stride 2, 2 x 16^3) 2.4 against 2.9.

Used only where torch's own bfloat16 linear and convolution are oneDNN's (``packed_linear.not_offered``)
and the compiled conversions run. The ops are private: where the running torch lacks one, or the
packed call does not compute a probe as torch's own bfloat16 convolution does, nothing is packed
and every call is torch's own.
"""

from __future__ import annotations

import functools
import math
from typing import List, Optional, Sequence

import torch

from .. import torch_names
from . import native, packed_linear

_REORDER = "torch._C._nn.mkldnn_reorder_conv2d_weight"
_CONVOLUTION = "torch.ops.mkldnn._convolution_pointwise"
_REORDER_3D = "torch._C._nn.mkldnn_reorder_conv3d_weight"
_REORDER_TRANSPOSED = "torch.ops.mkldnn._reorder_convolution_transpose_weight"
_CONVOLUTION_TRANSPOSED = "torch.ops.mkldnn._convolution_transpose_pointwise"
_ops = {}           # "reorder", "convolution" and their transposed twins, once found


@functools.lru_cache(maxsize=None)
def not_offered() -> Optional[str]:
    """None where this torch offers packed bfloat16 convolutions on this CPU, else why not.
    Cheap: nothing is computed."""
    reason = packed_linear.not_offered()
    if reason is not None:
        return reason
    for name in (_REORDER, _CONVOLUTION):
        if not torch_names.has(name):
            return f"torch {torch.__version__} has no {name}"
    return None


@functools.lru_cache(maxsize=None)
def transposed_unavailable() -> Optional[str]:
    """As ``unavailable``, for transposed convolutions (``conv_transpose1d``, ``conv_transpose2d``):
    their own two ops, then a probe of their own (strided with an output padding, grouped and
    dilated), once a process, at the first packed call."""
    reason = unavailable()
    if reason is not None:
        return reason
    for name in (_REORDER_TRANSPOSED, _CONVOLUTION_TRANSPOSED):
        if not torch_names.has(name):
            return f"torch {torch.__version__} has no {name}"
    try:
        _ops.update(reorder_transposed=torch_names.get(_REORDER_TRANSPOSED),
                    convolution_transposed=torch_names.get(_CONVOLUTION_TRANSPOSED))
        return _probed_transposed((5, 4))
    except (RuntimeError, NotImplementedError, TypeError) as exc:   # oneDNN refuses, or another schema
        return f"oneDNN's packed bfloat16 transposed convolution does not run here ({exc})"


@functools.lru_cache(maxsize=None)
def volumetric_transposed_unavailable() -> Optional[str]:
    """As ``transposed_unavailable``, for 3-D transposed convolutions (``conv_transpose3d``): the
    same ops on 5-D tensors, with a probe of their own."""
    reason = transposed_unavailable()
    if reason is not None:
        return reason
    try:
        return _probed_transposed((3, 5, 4))
    except (RuntimeError, NotImplementedError, TypeError) as exc:   # oneDNN refuses 5-D tensors
        return f"oneDNN's packed bfloat16 3-D transposed convolution does not run here ({exc})"


def _probed_transposed(spatial) -> Optional[str]:
    """As ``_probed``, for transposed convolutions over inputs of ``spatial`` sizes (two or three):
    a padded one, a strided and grouped one with an output padding, and a dilated one."""
    dimensions = len(spatial)
    own_convolution = torch.nn.functional.conv_transpose3d if dimensions == 3 \
        else torch.nn.functional.conv_transpose2d
    last = _channels_last(dimensions + 2)
    numbers = torch.Generator().manual_seed(0)
    for stride, padding, output_padding, groups, dilation in ((1, 1, 0, 1, 1), (2, 1, 1, 3, 1), (1, 0, 0, 1, 2)):
        x = torch.randn(2, 6, *spatial, generator=numbers, device="cpu").half()
        weight = torch.randn(6, 9 // groups, *[3] * dimensions, generator=numbers, device="cpu").bfloat16()
        bias = torch.randn(9, generator=numbers, device="cpu").bfloat16()
        arguments = ([padding] * dimensions, [output_padding] * dimensions, [stride] * dimensions,
                     [dilation] * dimensions, groups)
        packed = pack_transposed(weight, *arguments, list(x.shape))
        for layout in (torch.contiguous_format, last):
            given = x.contiguous(memory_format=layout)
            with torch.no_grad():
                own = own_convolution(given.bfloat16(), weight, bias, stride, padding, output_padding, groups,
                                      dilation)
                computed = convolution_transposed(given, packed, bias, *arguments, layout is last)
            if computed is None or not torch.equal(computed, own.half()) \
                    or computed.is_contiguous() != (layout is torch.contiguous_format):
                return (f"oneDNN's packed bfloat16 {dimensions}-D transposed convolution does not compute "
                        f"torch's bfloat16 transposed convolution here")
    return None


def transposed_usable() -> bool:
    """As ``usable``, for 1-D and 2-D transposed convolutions."""
    return torch.backends.mkldnn.enabled and transposed_unavailable() is None


def volumetric_transposed_usable() -> bool:
    """As ``usable``, for 3-D transposed convolutions."""
    return torch.backends.mkldnn.enabled and volumetric_transposed_unavailable() is None


@functools.lru_cache(maxsize=None)
def unavailable() -> Optional[str]:
    """None where float16 convolutions can run on packed bfloat16 weights here, else why not:
    ``not_offered``, the compiled conversions, then a probe, once a process, at the first
    packed call: a strided, padded and a grouped convolution, channel-first and channels-last,
    against torch's own bfloat16 convolution of the same input."""
    reason = not_offered() or native.why_not_used()
    if reason is not None:
        return reason
    try:
        _ops.update(reorder=torch_names.get(_REORDER), convolution=torch_names.get(_CONVOLUTION))
        return _probed((9, 7))
    except (RuntimeError, NotImplementedError, TypeError) as exc:   # oneDNN refuses, or another schema
        return f"oneDNN's packed bfloat16 convolution does not run here ({exc})"


def _probed(spatial) -> Optional[str]:
    """None where packed convolutions over inputs of ``spatial`` sizes (two or three) compute
    torch's own bfloat16 convolution, rounded to float16, in the layout CUDA returns, for a
    padded one and a strided and grouped one, from channel-first and channels-last inputs; else
    why not."""
    dimensions = len(spatial)
    own_convolution = torch.nn.functional.conv3d if dimensions == 3 else torch.nn.functional.conv2d
    last = _channels_last(dimensions + 2)
    numbers = torch.Generator().manual_seed(0)
    for stride, padding, groups in ((1, 1, 1), (2, 0, 3)):
        x = torch.randn(2, 6, *spatial, generator=numbers, device="cpu").half()
        weight = torch.randn(9, 6 // groups, *[3] * dimensions, generator=numbers, device="cpu").bfloat16()
        bias = torch.randn(9, generator=numbers, device="cpu").bfloat16()
        arguments = ([padding] * dimensions, [stride] * dimensions, [1] * dimensions, groups)
        packed = pack(weight, *arguments, list(x.shape))
        for layout in (torch.contiguous_format, last):
            given = x.contiguous(memory_format=layout)
            with torch.no_grad():
                own = own_convolution(given.bfloat16(), weight, bias, stride, padding, 1, groups)
                computed = convolution(given, packed, bias, *arguments, layout is last)
            if computed is None or not torch.equal(computed, own.half()) \
                    or computed.is_contiguous() != (layout is torch.contiguous_format):
                return (f"oneDNN's packed bfloat16 {dimensions}-D convolution does not compute torch's "
                        f"bfloat16 convolution here")
    return None


def usable() -> bool:
    """Whether a float16 convolution may run on a packed weight now: packing works here, and the
    program has not turned oneDNN off (``torch.backends.mkldnn.enabled``)."""
    return torch.backends.mkldnn.enabled and unavailable() is None


@functools.lru_cache(maxsize=None)
def volumetric_unavailable() -> Optional[str]:
    """As ``unavailable``, for 3-D convolutions (``conv3d``: video models, volumetric U-Nets):
    their own reorder, then a probe of their own (padded, and strided and grouped), once a
    process, at the first packed call."""
    reason = unavailable()
    if reason is not None:
        return reason
    if not torch_names.has(_REORDER_3D):
        return f"torch {torch.__version__} has no {_REORDER_3D}"
    try:
        _ops.update(reorder_3d=torch_names.get(_REORDER_3D))
        return _probed((5, 6, 4))
    except (RuntimeError, NotImplementedError, TypeError) as exc:   # oneDNN refuses, or another schema
        return f"oneDNN's packed bfloat16 3-D convolution does not run here ({exc})"


def volumetric_usable() -> bool:
    """As ``usable``, for 3-D convolutions."""
    return torch.backends.mkldnn.enabled and volumetric_unavailable() is None


def pack(weight: torch.Tensor, padding: List[int], stride: List[int], dilation: List[int],
         groups: int, input_size: List[int]) -> torch.Tensor:
    """``weight`` (bfloat16, out x in/groups x kH x kW, or a conv1d's out x in/groups x k, packed as
    a height of one) in oneDNN's layout for a convolution of these arguments over an input of
    ``input_size`` (a call on another size is computed alike, oneDNN reordering the weight where
    its kernel wants another layout)."""
    if weight.dim() == 3:
        weight = weight.unsqueeze(2)
    reorder = _ops["reorder_3d"] if weight.dim() == 5 else _ops["reorder"]
    return reorder(weight.contiguous().to_mkldnn(), padding, stride, dilation, groups, input_size)


def pack_transposed(weight: torch.Tensor, padding: List[int], output_padding: List[int], stride: List[int],
                    dilation: List[int], groups: int, input_size: List[int]) -> torch.Tensor:
    """``weight`` (bfloat16, in x out/groups x the kernel's sizes, a ``conv_transpose2d``'s or
    ``conv_transpose3d``'s, or a ``conv_transpose1d``'s packed as a height of one) in oneDNN's
    layout for a transposed convolution of these arguments over an input of ``input_size``."""
    if weight.dim() == 3:
        weight = weight.unsqueeze(2)
    return _ops["reorder_transposed"](weight.contiguous(), padding, output_padding, stride, dilation, groups,
                                      input_size)


def laid_out(x: torch.Tensor) -> Optional[bool]:
    """Whether a 4-D or 5-D host tensor is channels-last (True) or channel-first (False), dense
    either way; None for any other layout, which this path leaves to torch."""
    if x.is_contiguous():
        return False
    return True if x.is_contiguous(memory_format=_channels_last(x.dim())) else None


def _channels_last(dimensions: int) -> torch.memory_format:
    return torch.channels_last_3d if dimensions == 5 else torch.channels_last


def convolution(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor],
                padding: Sequence[int], stride: Sequence[int], dilation: Sequence[int], groups: int,
                channels_last: bool, borrowed=None, squeezed: bool = False) -> Optional[torch.Tensor]:
    """``F.conv2d`` of ``x`` (float16, 4-D, laid out as ``laid_out`` says) on ``pack(weight)``, in
    bfloat16, rounded to float16 once, channels-last where ``channels_last`` says so (as CUDA lays
    it out where the input or the weight is), else channel-first. ``borrowed(size, strides)``
    lends a bfloat16 buffer for the converted input (the policy's kept buffers), else one is
    made. ``squeezed``: ``x`` is a conv1d's input of height one, and the result a dense 3-D
    tensor, its height dropped. No gradient is recorded through it. None, with nothing computed,
    where the compiled conversions do not run here."""
    wide = _channels_last_bfloat16(x, borrowed)
    if wide is None:
        return None
    result = _ops["convolution"](wide, packed, bias, list(padding), list(stride), list(dilation), groups,
                                 "none", [], "")
    return _rounded(result, channels_last, squeezed)


def convolution_transposed(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor],
                           padding: Sequence[int], output_padding: Sequence[int], stride: Sequence[int],
                           dilation: Sequence[int], groups: int, channels_last: bool,
                           borrowed=None, squeezed: bool = False) -> Optional[torch.Tensor]:
    """``F.conv_transpose2d`` (or ``conv_transpose3d``) of ``x`` on ``pack_transposed(weight)``, as
    ``convolution`` computes ``F.conv2d``; ``squeezed``: ``x`` is a ``conv_transpose1d``'s input of
    height one."""
    wide = _channels_last_bfloat16(x, borrowed)
    if wide is None:
        return None
    result = _ops["convolution_transposed"](wide, packed, bias, list(padding), list(output_padding),
                                            list(stride), list(dilation), groups, "none", [], "")
    return _rounded(result, channels_last, squeezed)


def _channels_last_bfloat16(x: torch.Tensor, borrowed) -> Optional[torch.Tensor]:
    """``x`` (float16, 4-D or 5-D, dense) in bfloat16, channels-last, in one pass; None where the
    compiled conversions do not run here."""
    batch, channels, *spatial = x.shape
    positions = math.prod(spatial)
    strides = [positions * channels, 1]
    for size in spatial:
        positions //= size
        strides.append(positions * channels)
    wide = borrowed(x.shape, tuple(strides)) if borrowed is not None \
        else torch.empty_strided(x.shape, strides, dtype=torch.bfloat16, device="cpu")
    converted = native.converted_into(x, wide, torch.bfloat16) if laid_out(x) \
        else native.converted_transposed_into(x, wide, torch.bfloat16, batch, channels, math.prod(spatial))
    return wide if converted else None


def _rounded(result: torch.Tensor, channels_last: bool, squeezed: bool) -> torch.Tensor:
    """oneDNN's bfloat16 result rounded to float16 once, in the layout CUDA returns."""
    layout = _channels_last(result.dim())
    if not result.is_contiguous(memory_format=layout):
        result = result.contiguous(memory_format=layout)                # not torch's kernel seen here
    if channels_last:                       # oneDNN's result is channels-last: rounded where it lies
        return native.reduced_converted_in_place(result, torch.float16, frozenset())
    batch, channels, *spatial = result.shape
    out = torch.empty((batch, channels, spatial[-1]) if squeezed else result.shape, dtype=torch.float16,
                      device="cpu")
    native.converted_transposed_into(result, out, torch.float16, batch, math.prod(spatial), channels)
    return out
