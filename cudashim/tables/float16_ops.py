"""The float16 ops outside the matmul family whose speed the precision policy measures.

Where float16 is slow, a CPU computes the matmul family many times slower than float32
(``patches/precision.py`` widens it). The rest of what a float16 model runs is mostly
memory-bound: torch's CPU kernels convert float16 to float32 lane by lane and back, and read
half the bytes, so as asked it often beats computing in float32, which costs a conversion
each way. Which way is faster depends on the CPU's conversion instructions, so each op here is
timed both ways on the host (``backends/cpu_speed.py``) and widened only where float32 wins.

Each entry: the ``torch.nn.functional`` name (what the nn modules call), the sample it is
timed on ("tokens": 4 x 128 x 1024, a transformer's activations; "images": 8 x 64 x 32 x 32,
a convnet's), and the arguments after the input.

Left out, because computing on a widened copy would lose a write the op makes in place:
``batch_norm`` and ``instance_norm`` (their running statistics, in training), and the
activations with ``inplace=`` (``relu``, ``silu``, ``hardtanh``...). ``embedding`` is a
lookup, as asked always (widened, it would convert the whole table, 20 times slower here),
and its ``max_norm`` renormalizes the weight in place. Methods called on a tensor
(``x.softmax(-1)``) are not reached.
"""

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
}

SAMPLES = {"tokens": (4, 128, 1024), "images": (8, 64, 32, 32)}

# float32 must be faster than this fraction of float16's time to be chosen: the widened call
# holds a float32 copy of its input and output, and near a tie as asked is kept.
WIDEN_BELOW = 0.9
