"""Host memory a program frees is kept for its next tensors where device memory is host memory,
as CUDA's caching allocator keeps device memory; torch.cuda.empty_cache() gives it back.

On the CPU backend only: a device with memory of its own has its own allocator
(``cudashim.host_memory`` says why and what is left alone).
"""

import logging

from .. import host_memory

log = logging.getLogger(__name__)


def install(activation):
    if not getattr(activation.backend, "device_memory_is_host", False):
        return
    why_not = host_memory.keep_freed()
    if why_not is not None:
        log.info("cudashim: freed host memory is not kept: %s", why_not)
        return
    activation.registry.add_undo("freed host memory kept, as CUDA's caching allocator keeps it",
                                 host_memory.restore)
