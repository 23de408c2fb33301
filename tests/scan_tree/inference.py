"""Generation with flash attention, imported under an alias."""
import torch as th
from flash_attn import flash_attn_func  # scan: handled

from kernels.fused import add


@th.no_grad()
def attend(q, k, v):
    q, k, v = (t.half().to("cuda:0") for t in (q, k, v))  # scan: handled
    if not q.is_cuda:  # scan: handled
        raise RuntimeError("inputs must be on the GPU")
    out = flash_attn_func(q, k, v, causal=True)
    th.cuda._sleep(100)  # scan: needs a change
    return add(out, out)


def padded(ids, model):
    hidden = model.embed(ids)
    mask = ids.ne(0).to(hidden.device)  # scan: runs differently
    mask[:, 0] = True
    on_weights = ids.ne(0).to(model.embed.weight.device)
    on_weights[:, 0] = True
    return mask & on_weights


def prefetched(batch, hidden):
    return batch.pin_memory().to(f"{hidden.device}", non_blocking=True)  # scan: runs differently


from flash_attn.ops.fused_dense import FusedDense  # scan: cannot run here
