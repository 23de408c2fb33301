"""The float16 ops outside the matmul family whose speed the precision policy measures.

Where float16 is slow, a CPU computes the matmul family many times slower than float32
(``patches/precision.py`` widens it). The rest of what a float16 model runs is mostly
memory-bound: torch's CPU kernels convert float16 to float32 lane by lane and back, and read
half the bytes, so as asked it often beats computing in float32, which costs a conversion
each way. Which way is faster depends on the CPU's conversion instructions, so each op here is
timed both ways on the host (``backends/cpu_speed.py``) and widened only where float32 wins.

Each entry: the ``torch.nn.functional`` name (what the nn modules call), or the name of the
op ``CALLED_AS`` gives the places of, the sample it is timed on ("tokens": 4 x 128 x 1024, a
transformer's activations; "images": 8 x 64 x 32 x 32, a convnet's; "signals": 8 x 64 x 1024, a
1-D convnet's), and the arguments after the input.

Left out, because computing on a widened copy would lose a write the op makes in place:
``batch_norm`` and ``instance_norm`` (their running statistics, in training), and the
activations with ``inplace=`` (``relu``, ``silu``, ``hardtanh``...). ``embedding`` is a
lookup, as asked always (widened, it would convert the whole table, 20 times slower here),
and its ``max_norm`` renormalizes the weight in place. Methods called on a tensor
(``x.softmax(-1)``) are not reached, except where ``CALLED_AS`` names them. Where an op's speed
turns on an argument (the dimension a reduction runs over, pow's exponent, grid_sample's mode),
``ONLY_WHEN`` names the calls its choice covers.
"""

import importlib


class Operand:
    """Stands, among the arguments after the sample, for a second operand made from it (in the
    dtype the sample is timed in): ``SAMPLE``, the sample again (cosine_similarity's two
    operands); ``GRID``, a grid of sampling positions for it (grid_sample's)."""

    def __init__(self, name, make):
        self.name, self.of = name, make

    def __repr__(self):
        return self.name


def _grid_for(images):
    """Sampling positions for a batch of images, one per pixel, spread over the whole image in
    random places (as a deformable attention samples): (N, H, W, 2) in [-1, 1], drawn from a
    generator of its own, so that the program's random numbers are untouched."""
    import torch
    batch, _, height, width = images.shape
    numbers = torch.Generator().manual_seed(0)
    return (torch.rand(batch, height, width, 2, generator=numbers) * 2 - 1).to(images.dtype)


SAMPLE = Operand("SAMPLE", lambda sample: sample)
GRID = Operand("GRID", _grid_for)

OPS = {
    "layer_norm": ("tokens", ((1024,),)),
    "rms_norm": ("tokens", ((1024,),)),             # torch.nn.functional has it from 2.4
    "group_norm": ("images", (8,)),
    "softmax": ("tokens", (-1,)),
    "log_softmax": ("tokens", (-1,)),
    "gelu": ("tokens", ()),
    "avg_pool2d": ("images", (2,)),
    "adaptive_avg_pool2d": ("images", (1,)),
    "max_pool2d": ("images", (2,)),
    "interpolate": ("images", (None, 2.0, "bilinear")),
    # F.normalize takes a float16 norm, 7x float32's time here (CLIP's embeddings, contrastive losses).
    "normalize": ("tokens", (2.0, -1)),
    # x.pow(3) in the tanh GELU of GPT-2's family, x.pow(2) in hand-written RMSNorms, x ** 2
    # in losses: torch's CPU kernel computes float16 powers element by element, 30x float32's
    # time on an AVX2 host, every exponent alike (bfloat16's has vectorized ones).
    "pow": ("tokens", (3.0,)),
    # Greedy decoding's pick over float16 logits, a classifier's prediction: torch's CPU kernels
    # compare float16 element by element. On an AVX512-BF16 EPYC, argmax over 8 x 151,936 logits
    # (a Qwen vocabulary) took 2.6 ms as asked, 0.55 ms widened. The indices are the same either way:
    # float32 holds every float16 exactly, and ties go to the first index both ways.
    "argmax": ("tokens", (-1,)),
    "argmin": ("tokens", (-1,)),
    # A 1-D convnet's pooling (audio, time series): 1.18 ms as asked, 0.31 widened there, where
    # max_pool2d's kernel is vectorized for float16.
    "max_pool1d": ("signals", (2,)),
    # Norms of float16 rows (hand-written RMSNorms, embeddings normalized for retrieval, gradient
    # norms), and cosine similarities (CLIP-style contrastive losses): torch's CPU kernels reduce
    # float16 lane by lane, 4.7x and 3.2x float32's time there. torch.norm and Tensor.norm reach
    # torch.linalg.vector_norm at their call.
    "vector_norm": ("tokens", (2.0, -1)),
    "cosine_similarity": ("tokens", (SAMPLE, -1)),
    # Bilinear sampling at arbitrary positions: deformable attention's pure-PyTorch path
    # (Deformable DETR, Mask2Former, DINO), spatial transformers, optical flow's warps. On an
    # AVX512-BF16 EPYC, sampling 16 x 32 x 64 x 64 values at 300 x 16 points took 10.0 ms as
    # asked and 4.5 ms widened; nearest sampling is the other way round (0.33 against 1.33 ms on
    # the images sample), so only bilinear calls are widened (``ONLY_WHEN``).
    "grid_sample": ("images", (GRID, "bilinear", "zeros", False)),
    # Reversing the last dimension (horizontal flips of images, test-time augmentation): 0.15 ms
    # as asked, 0.08 widened there. A flip of a leading dimension copies whole rows, 0.02 ms as
    # asked and 30 times that widened, so only flips that reverse the last dimension are widened.
    "flip": ("tokens", ((-1,),)),
}

# An op that programs reach by more names than its ``torch.nn.functional`` one: every (owner,
# attribute) it is called through, the first the one timed. ``square`` is ``pow(x, 2)``'s kernel.
# The in-place ``pow_`` and ``**=`` are not reached (a widened copy would lose their write).
CALLED_AS = {
    "pow": (("torch", "pow"), ("torch.Tensor", "pow"), ("torch.Tensor", "__pow__"),
            ("torch", "square"), ("torch.Tensor", "square")),
    "argmax": (("torch", "argmax"), ("torch.Tensor", "argmax")),
    "argmin": (("torch", "argmin"), ("torch.Tensor", "argmin")),
    "vector_norm": (("torch.linalg", "vector_norm"),),
    "flip": (("torch", "flip"), ("torch.Tensor", "flip")),
}


def _argument(args, kwargs, index, name, default):
    """A call's argument by position (counting the input) or by keyword, else its default."""
    return args[index] if len(args) > index else kwargs.get(name, default)


def _is_last(dim, dims: int) -> bool:
    """Whether ``dim`` names the last of ``dims`` dimensions (a scalar's one dimension counting);
    a dimension out of range is not, and torch's own call refuses it."""
    dims = max(dims, 1)
    return isinstance(dim, int) and not isinstance(dim, bool) and dim in (-1, dims - 1)


def _bilinear(args, kwargs) -> bool:
    """grid_sample(input, grid, mode="bilinear", ...) of images, as the table times it."""
    return _argument(args, kwargs, 2, "mode", "bilinear") == "bilinear" and args[0].dim() == 4


def _bilinear_upsampling(args, kwargs) -> bool:
    """interpolate(input, size, scale_factor, mode="nearest", align_corners, recompute_scale_factor,
    antialias=False) bilinear, of images, to sizes at least theirs (as the table times it), or
    antialiased (torch has no float16 kernel for that on the host: widened, it runs)."""
    if _argument(args, kwargs, 3, "mode", "nearest") != "bilinear" or args[0].dim() != 4:
        return False
    if _argument(args, kwargs, 6, "antialias", False):
        return True
    size = _argument(args, kwargs, 1, "size", None)
    if size is not None:
        sizes = size if isinstance(size, (list, tuple)) else (size, size)
        return all(new >= old for new, old in zip(sizes, args[0].shape[2:]))
    scale = _argument(args, kwargs, 2, "scale_factor", None)
    scales = scale if isinstance(scale, (list, tuple)) else (scale, scale)
    return all(isinstance(factor, (int, float)) and factor >= 1 for factor in scales)


def _reverses_the_last_dimension(args, kwargs) -> bool:
    """flip(input, dims), Tensor.flip(dims) or Tensor.flip(*dims), reversing the last dimension."""
    if len(args) > 2:
        dims = args[1:]
    elif len(args) == 2:
        dims = args[1] if isinstance(args[1], (list, tuple)) else (args[1],)
    else:
        dims = kwargs.get("dims", ())
    return any(_is_last(dim, args[0].dim()) for dim in dims)


def _over_the_last_dimension(at: int, default=None, or_the_whole: bool = False):
    """A test that a call's ``dim`` (at position ``at``, counting the input; ``default`` where
    not given) names the last dimension of its operands, or, ``or_the_whole``, is None (a
    reduction of the whole tensor, argmax's default)."""
    def over_the_last_dimension(args, kwargs) -> bool:
        import torch
        dim = _argument(args, kwargs, at, "dim", default)
        if dim is None:
            return or_the_whole
        operands = (*args, *kwargs.values())
        return _is_last(dim, max(value.dim() for value in operands if isinstance(value, torch.Tensor)))
    return over_the_last_dimension


def _two_norm_over_trailing_dimensions(args, kwargs) -> bool:
    """vector_norm(input, ord=2, dim=None, ...): a 2-norm of the whole tensor or of its last
    dimensions (a norm over leading ones strides across rows, and 1- and inf-norms tie)."""
    if _argument(args, kwargs, 1, "ord", 2) != 2:
        return False
    dims, ndim = _argument(args, kwargs, 2, "dim", None), max(args[0].dim(), 1)
    if dims is None:
        return True
    dims = dims if isinstance(dims, (list, tuple)) else (dims,)
    if not all(isinstance(dim, int) and -ndim <= dim < ndim for dim in dims):
        return False
    return sorted(dim % ndim for dim in dims) == list(range(ndim - len(dims), ndim))


def _two_norm_over_the_last_dimension(args, kwargs) -> bool:
    """normalize(input, p=2.0, dim=1, ...) by 2-norms of its last dimension."""
    return _argument(args, kwargs, 1, "p", 2.0) == 2 and _is_last(_argument(args, kwargs, 2, "dim", 1), args[0].dim())


# The exponents torch's float32 CPU kernel computes in vector instructions (squares, cubes,
# square roots and their reciprocals); float16 computes every exponent element by element.
# Other exponents take float32 as long as float16 (4, 1.5, a tensor of exponents: 1.03-1.08 of
# its time on an AVX512-BF16 EPYC), and 0 and 1 are copies, 4-5 times faster as asked.
_VECTORIZED_EXPONENTS = (2, 3, -1, -2, 0.5, -0.5)


def _a_vectorized_exponent(args, kwargs) -> bool:
    """pow(input, exponent), x ** exponent, or square(input) (an exponent of 2)."""
    exponent = _argument(args, kwargs, 1, "exponent", 2)
    return isinstance(exponent, (int, float)) and not isinstance(exponent, bool) \
        and exponent in _VECTORIZED_EXPONENTS


# The calls of an op a choice covers, where its speed depends on its arguments as much as on its
# size: the calls like the one it was timed on (a test of a call's arguments, and what doctor
# says of them); every other call is computed as asked. On an AVX512-BF16 EPYC, reductions over
# a leading dimension of the tokens sample took float32 1.5-2 times float16's time (vector_norm,
# normalize, cosine_similarity, softmax), where over the last they took 0.25-0.55 of it; an
# argmax over dimension 1, 0.81; a bilinear downsampling, 1.8 where an upsampling took 1.25.
ONLY_WHEN = {
    "grid_sample": (_bilinear, "bilinear sampling of images only"),
    "flip": (_reverses_the_last_dimension, "flips reversing the last dimension only"),
    "interpolate": (_bilinear_upsampling, "bilinear upsampling of images only (antialiased resizing too)"),
    "softmax": (_over_the_last_dimension(1), "over the last dimension only"),
    "log_softmax": (_over_the_last_dimension(1), "over the last dimension only"),
    "argmax": (_over_the_last_dimension(1, or_the_whole=True), "over the last dimension or the whole tensor only"),
    "argmin": (_over_the_last_dimension(1, or_the_whole=True), "over the last dimension or the whole tensor only"),
    "vector_norm": (_two_norm_over_trailing_dimensions, "2-norms over trailing dimensions or the whole tensor only"),
    "normalize": (_two_norm_over_the_last_dimension, "by 2-norms of the last dimension only"),
    "cosine_similarity": (_over_the_last_dimension(2, default=1), "over the last dimension only"),
    "pow": (_a_vectorized_exponent, "exponents 2, 3, -1, -2, 0.5 and -0.5 only"),
}

SAMPLES = {"tokens": (4, 128, 1024), "images": (8, 64, 32, 32), "signals": (8, 64, 1024)}

# float32 must be faster than this fraction of float16's time to be chosen. The widened call
# costs more in a program than where the table times it: its float32 result is a fresh buffer
# of twice the bytes, freed at once, and in a program's heap such a buffer often comes back
# from the system page by page. In a shimmed 4-block GPT generation on one thread, gelu timed
# 0.80 of float16's time widened cost 12 ms more over its 96 calls than as asked: 8 x 20 x
# 2048 widened took 608 page faults a call, 945 us against 126 as asked. The ops that win by
# more (pow, normalize, group_norm: 0.1 to 0.6 here) are widened; a near tie is kept as asked.
WIDEN_BELOW = 0.75

# An op widened on its sample is timed again on samples up to this many times as large (the
# leading dimension grown): float32 wins on a sample the caches hold, where its arithmetic
# decides, and can lose past them, where the bytes moved do, twice float16's each way and a
# fresh result buffer. On the Xeon with AMX-BF16, group_norm took 0.45 of float16's time
# widened on 8 x 64 x 32 x 32, 0.79 at 8 times that, and 2.9 at 16 times (a diffusion model's
# activations are that size); pow and normalize turn the same way, later. The op is widened up
# to the largest size at which it still won (``GROWN_SCALES``, bisected), as asked beyond.
GROWN_SCALES = (2, 4, 8, 16)


def places(name):
    """[(owner, attribute, the name the report gives)] for the op ``name``: its functional
    alone unless ``CALLED_AS`` names more. An owner this torch lacks the attribute on is left out."""
    found = []
    for owner_path, attribute in CALLED_AS.get(name, (("torch.nn.functional", name),)):
        if owner_path == "torch.Tensor":
            owner, shown = importlib.import_module("torch").Tensor, "Tensor"
        else:
            owner, shown = importlib.import_module(owner_path), owner_path
        if callable(getattr(owner, attribute, None)):
            found.append((owner, attribute, f"{shown}.{attribute}"))
    return found
