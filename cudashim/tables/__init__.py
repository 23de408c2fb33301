"""What torch and the CUDA libraries have, and what cudashim does with each: the tables.

- ``libraries``: the CUDA libraries programs import (who hears the truth about CUDA, what
  ``cudashim scan`` reports and the way out, which get a stand-in and how each is tried);
- ``cuda_surface``: every public name of ``torch.cuda`` that needs a reason (the same, refused,
  or harmless), and how the surface is enumerated;
- ``device_parameters``: torch's device parameters that are delegated or left alone, and the
  private entry points libraries call with a device;
- ``dtype_gaps``: the dtypes CUDA's kernels accept and the CPU's refuse (generated), and
  ``dtype_gaps_by_release`` the gaps other torch releases have beyond them;
- ``compiled_twins``: the compiled fast path's types and their Python twins.

Everything above reads them; they import nothing of cudashim's, and no torch at import.
"""
