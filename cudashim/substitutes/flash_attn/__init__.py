"""cudashim's stand-in for flash_attn (FlashAttention 2's Python API) on torch operations.

Served under the name ``flash_attn`` where the real package cannot work on the target (see
``cudashim/substitutes/finder.py``). What it provides is the functional API, the padding
helpers and the rotary helpers; importing any other part of flash_attn (``flash_attn.modules``,
``flash_attn.ops``, ``flash_attn.losses``) raises an ImportError naming the way out.
"""

from cudashim.substitutes import LIBRARIES

from .flash_attn_interface import (flash_attn_func, flash_attn_kvpacked_func,
                                   flash_attn_qkvpacked_func, flash_attn_varlen_func,
                                   flash_attn_varlen_kvpacked_func,
                                   flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache)

__version__ = LIBRARIES["flash_attn"].full_version

__all__ = ["flash_attn_func", "flash_attn_kvpacked_func", "flash_attn_qkvpacked_func",
           "flash_attn_varlen_func", "flash_attn_varlen_kvpacked_func",
           "flash_attn_varlen_qkvpacked_func", "flash_attn_with_kvcache"]
