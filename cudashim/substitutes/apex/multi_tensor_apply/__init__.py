"""apex.multi_tensor_apply: ``multi_tensor_applier(op, overflow_buf, tensor_lists, *args)``
calls ``op(chunk_size, overflow_buf, tensor_lists, *args)``, as apex's does; the ops are
``amp_C``'s (cudashim's stand-in, on ``torch._foreach_*``)."""


class MultiTensorApply:
    available = True
    warned = False

    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size

    def check_avail(self):
        return None

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
