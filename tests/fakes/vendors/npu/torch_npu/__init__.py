"""A stand-in for Huawei's torch_npu in tests: the fake accelerator named ``npu``, the
``hccl`` collective (run by gloo) and the sign-bit packing ops cudashim.kernels uses."""

import torch

import fake_accelerator

npu = fake_accelerator.install("npu")
fake_accelerator.register_collective("hccl")


def npu_sign_bits_pack(input, size):
    """Signs of a 1-D float tensor packed eight to a byte, most significant bit first,
    1 for values >= 0, padded to whole bytes; shape (size, -1)."""
    if input.dim() != 1 or input.dtype not in (torch.float16, torch.float32):
        raise RuntimeError("npu_sign_bits_pack expects a 1-D float16 or float32 tensor")
    bits = (input >= 0).to(torch.uint8)
    bits = torch.nn.functional.pad(bits, (0, (-bits.numel()) % 8)).view(-1, 8)
    weights = torch.tensor([128, 64, 32, 16, 8, 4, 2, 1], dtype=torch.uint8, device=input.device)
    return (bits * weights).sum(dim=1, dtype=torch.uint8).view(size, -1)


def npu_sign_bits_unpack(input, size, dtype):
    """The inverse: +1 / -1 in ``dtype`` for every bit, shape (size, -1)."""
    shifts = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0], dtype=torch.uint8, device=input.device)
    bits = (input.view(-1, 1) >> shifts).bitwise_and(1).view(-1)
    return (bits.to(dtype) * 2 - 1).view(size, -1)
