"""Results that a call asked for in a tensor of its own: ``out=``.

Where cudashim computes a call another way (in a wider dtype, on a copy), the result is a new
tensor; a call that named an ``out=`` tensor must find it there, as torch's out= variants
write it, or the program reads a tensor nobody wrote.
"""

from __future__ import annotations

import warnings


def written_to(out, result):
    """``result`` written into ``out`` (cast to its dtype) and ``out`` returned, as torch's
    out= variants do: an ``out`` of another shape is resized, with torch's warning where it
    held elements (an empty one is resized silently)."""
    if out.shape != result.shape:
        if out.numel():
            warnings.warn(
                f"An output with one or more elements was resized since it had shape "
                f"{list(out.shape)}, which does not match the required output shape "
                f"{list(result.shape)}. Resize it to zero elements first (t.resize_(0)) to "
                f"reuse it without this warning.", UserWarning, stacklevel=3)
        out.resize_(result.shape)
    return out.copy_(result)
