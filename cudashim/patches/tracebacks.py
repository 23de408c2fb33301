"""A refusal printed uncaught ends its traceback at the program's own line.

cudashim answers an unsupported CUDA API, or a CUDA device past the count, with an error
raised inside its proxy; the frames between the program's call and that raise say nothing
the message does not. Only the printout of an uncaught refusal leaves them out: while the
program runs, the exception keeps every frame (``traceback.print_exc()``, logging and
debuggers see them all).
"""

import functools
import os
import sys
import types

from ..errors import is_refusal

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def install(activation):
    activation.registry.set_attr(sys, "excepthook", functools.partial(_print_refusals_short, sys.excepthook))


def _print_refusals_short(excepthook, kind, value, tb):
    if isinstance(value, BaseException) and is_refusal(value):
        tb = up_to_the_program(tb)
        value = value.with_traceback(tb)       # python prints the exception's own traceback
    excepthook(kind, value, tb)


def up_to_the_program(tb):
    """``tb`` without the cudashim frames it ends with (a new chain: the original stays whole)."""
    frames = []
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    while len(frames) > 1 and frames[-1].tb_frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frames.pop()
    trimmed = None
    for entry in reversed(frames):
        trimmed = types.TracebackType(trimmed, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return trimmed
