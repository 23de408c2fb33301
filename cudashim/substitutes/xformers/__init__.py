"""cudashim's stand-in for xformers: ``xformers.ops.memory_efficient_attention`` on torch's
scaled_dot_product_attention, with the attention biases programs pass.

Served under the name ``xformers`` where the real package cannot work on the target (see
``cudashim/substitutes/finder.py``).
"""

from cudashim.substitutes import LIBRARIES

__version__ = LIBRARIES["xformers"].full_version
_has_cpp_library = False
_is_triton_available = False
