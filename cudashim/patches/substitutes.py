"""CUDA-only libraries (flash_attn, xformers, apex, pynvml) get a stand-in where the real package cannot work.

The import hook (``cudashim/substitutes/finder.py``) goes first on ``sys.meta_path`` and
decides per library at its first import; ``--substitute`` chooses the libraries. A library
imported before activation (torch imports pynvml itself) is decided at once, and where the
stand-in is served, the references to the real modules point at it. Deactivation takes the
hook out, the stand-ins out of ``sys.modules`` and the real modules back in.
"""

from ..substitutes.finder import SubstituteFinder, enabled_libraries


def install(activation):
    enabled = enabled_libraries(activation.settings)
    if not enabled:
        return
    finder = SubstituteFinder(activation, enabled)
    finder.install()
    finder.replace_imported(activation.registry)
