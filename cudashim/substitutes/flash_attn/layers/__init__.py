"""flash_attn.layers: the rotary helpers (``flash_attn.layers.rotary``)."""
