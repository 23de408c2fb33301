"""Triton kernels written for CUDA in the style of Triton's tutorials, checked against torch.

python triton_tutorials.py OUT.json

- an elementwise kernel with a float scalar and a grid computed from the launch's meta-parameters;
- a persistent row softmax whose grid is sized from the driver's device properties and a
  warmed-up kernel's registers and shared memory, launched through the compiled kernel;
- layer norm forward and backward, the weight gradients summed in a few partial buffers that a
  spin lock of atomics guards, then reduced by a second kernel;
- an autotuned float16 matmul in grouped program order with an activation helper kernel;
- a chunked running sum as flash-linear-attention writes its kernels: block pointers, a
  heuristic, a loop counter converted with ``.to()``, in float32 and bfloat16;
- libdevice math (``asin``, ``tanh``);
- a kernel registered as a torch operator with ``torch.library.triton_op`` (torch 2.6 and later).

Each result is compared with torch's own op; OUT.json gets {kernel: largest absolute error}, the
largest magnitude of the results rounded to 16 bits, the device each result came back on, and the
config the autotuner ran.
"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

DEVICE = triton.runtime.driver.active.get_active_torch_device()


# --- elementwise -------------------------------------------------------------------------
@triton.jit
def axpy_kernel(alpha, x_ptr, y_ptr, out_ptr, size, BLOCK: tl.constexpr):
    offsets = tl.program_id(axis=0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < size
    x = tl.load(x_ptr + offsets, mask=inside)
    y = tl.load(y_ptr + offsets, mask=inside)
    tl.store(out_ptr + offsets, alpha * x + y, mask=inside)


def axpy(alpha, x, y):
    assert x.is_cuda and y.is_cuda
    out = torch.empty_like(x)
    size = out.numel()
    axpy_kernel[lambda meta: (triton.cdiv(size, meta["BLOCK"]), )](alpha, x, y, out, size, BLOCK=128)
    return out


# --- persistent softmax ------------------------------------------------------------------
@triton.jit
def row_softmax_kernel(out_ptr, in_ptr, in_stride, out_stride, rows, cols,
                       BLOCK: tl.constexpr, STAGES: tl.constexpr):
    columns = tl.arange(0, BLOCK)
    for row in tl.range(tl.program_id(0), rows, tl.num_programs(0), num_stages=STAGES):
        values = tl.load(in_ptr + row * in_stride + columns, mask=columns < cols, other=-float("inf"))
        shifted = tl.exp(values - tl.max(values, axis=0))
        tl.store(out_ptr + row * out_stride + columns, shifted / tl.sum(shifted, axis=0), mask=columns < cols)


def row_softmax(x):
    device = triton.runtime.driver.active.get_current_device()
    limits = triton.runtime.driver.active.utils.get_device_properties(device)
    rows, cols = x.shape
    block, warps, stages = triton.next_power_of_2(cols), 4, 2
    out = torch.empty_like(x)
    compiled = row_softmax_kernel.warmup(out, x, x.stride(0), out.stride(0), rows, cols, BLOCK=block,
                                         STAGES=stages, num_warps=warps, grid=(1, ))
    compiled._init_handles()
    per_sm = limits["max_num_regs"] // (compiled.n_regs * limits["warpSize"] * warps)
    if triton.runtime.driver.active.get_current_target().backend != "hip":
        per_sm = min(per_sm, limits["max_shared_mem"] // compiled.metadata.shared)
    programs = min(limits["multiprocessor_count"] * per_sm, rows)
    compiled[(programs, 1, 1)](out, x, x.stride(0), out.stride(0), rows, cols, block, stages)
    return out


# --- layer norm, forward and backward ----------------------------------------------------
@triton.jit
def norm_forward_kernel(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, stride, width, eps,
                        BLOCK: tl.constexpr):
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < width
    x = tl.load(x_ptr + row * stride + columns, mask=inside, other=0.0).to(tl.float32)
    mean = tl.sum(x, axis=0) / width
    centred = tl.where(inside, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centred * centred, axis=0) / width + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + columns, mask=inside)
    b = tl.load(b_ptr + columns, mask=inside)
    tl.store(y_ptr + row * stride + columns, centred * rstd * w + b, mask=inside)


@triton.jit
def norm_backward_kernel(dx_ptr, dy_ptr, partial_dw_ptr, partial_db_ptr, x_ptr, w_ptr, mean_ptr, rstd_ptr,
                         locks_ptr, stride, width, GROUPS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    columns = tl.arange(0, BLOCK)
    inside = columns < width
    x = tl.load(x_ptr + row * stride + columns, mask=inside, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + row * stride + columns, mask=inside, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + columns, mask=inside).to(tl.float32)
    normalized = tl.where(inside, (x - tl.load(mean_ptr + row)) * tl.load(rstd_ptr + row), 0.0)
    weighted = tl.where(inside, w * dy, 0.0)
    mean_product = tl.sum(normalized * weighted, axis=0) / width
    mean_weighted = tl.sum(weighted, axis=0) / width
    dx = (weighted - (normalized * mean_product + mean_weighted)) * tl.load(rstd_ptr + row)
    tl.store(dx_ptr + row * stride + columns, dx, mask=inside)
    # Rows share GROUPS partial sums; a lock per group and a "written" flag beside it.
    group = row % GROUPS
    lock = locks_ptr + group
    written = locks_ptr + GROUPS + group
    dw = dy * normalized
    db = dy
    while tl.atomic_cas(lock, 0, 1) == 1:
        pass
    if tl.load(written) == 0:
        tl.atomic_xchg(written, 1)
    else:
        dw += tl.load(partial_dw_ptr + group * width + columns, mask=inside)
        db += tl.load(partial_db_ptr + group * width + columns, mask=inside)
    tl.store(partial_dw_ptr + group * width + columns, dw, mask=inside)
    tl.store(partial_db_ptr + group * width + columns, db, mask=inside)
    tl.atomic_xchg(lock, 0)


@triton.jit
def column_sum_kernel(partial_ptr, out_ptr, rows, width, ROWS: tl.constexpr, COLUMNS: tl.constexpr):
    columns = tl.program_id(0) * COLUMNS + tl.arange(0, COLUMNS)
    total = tl.zeros((ROWS, COLUMNS), dtype=tl.float32)
    for first in range(0, rows, ROWS):
        row_ids = first + tl.arange(0, ROWS)
        inside = (row_ids[:, None] < rows) & (columns[None, :] < width)
        total += tl.load(partial_ptr + row_ids[:, None] * width + columns[None, :], mask=inside, other=0.0)
    tl.store(out_ptr + columns, tl.sum(total, axis=0), mask=columns < width)


class TritonLayerNorm(torch.autograd.Function):
    GROUPS = 4

    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        rows, width = x.shape
        y = torch.empty_like(x)
        mean = torch.empty(rows, dtype=torch.float32, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(width)
        norm_forward_kernel[(rows, )](x, y, weight, bias, mean, rstd, x.stride(0), width, eps, BLOCK=block,
                                      num_warps=4)
        ctx.save_for_backward(x, weight, mean, rstd)
        ctx.block = block
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight, mean, rstd = ctx.saved_tensors
        rows, width = x.shape
        groups = TritonLayerNorm.GROUPS
        locks = torch.zeros(2 * groups, dtype=torch.int32, device=x.device)
        partial_dw = torch.zeros((groups, width), dtype=torch.float32, device=x.device)
        partial_db = torch.zeros((groups, width), dtype=torch.float32, device=x.device)
        dx = torch.empty_like(dy)
        norm_backward_kernel[(rows, )](dx, dy.contiguous(), partial_dw, partial_db, x, weight, mean, rstd,
                                       locks, x.stride(0), width, GROUPS=groups, BLOCK=ctx.block)
        dw = torch.empty(width, dtype=weight.dtype, device=x.device)
        db = torch.empty(width, dtype=weight.dtype, device=x.device)
        grid = lambda meta: (triton.cdiv(width, meta["COLUMNS"]), )
        column_sum_kernel[grid](partial_dw, dw, groups, width, ROWS=4, COLUMNS=32)
        column_sum_kernel[grid](partial_db, db, groups, width, ROWS=4, COLUMNS=32)
        return dx, dw, db, None


# --- autotuned matmul --------------------------------------------------------------------
def matmul_configs():
    shapes = ((64, 128, 32, 4), (32, 64, 32, 2), (16, 32, 16, 1))
    return [triton.Config({"TILE_M": m, "TILE_N": n, "TILE_K": k, "SUPER": 4}, num_warps=warps, num_stages=3)
            for m, n, k, warps in shapes]


@triton.jit
def squared_relu(x):
    positive = tl.maximum(x, 0.0)
    return positive * positive


@triton.autotune(configs=matmul_configs(), key=["M", "N", "K"])
@triton.jit
def matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, a_row, a_col, b_row, b_col, c_row, c_col,
                  TILE_M: tl.constexpr, TILE_N: tl.constexpr, TILE_K: tl.constexpr, SUPER: tl.constexpr,
                  ACTIVATION: tl.constexpr):
    program = tl.program_id(0)
    tiles_m = tl.cdiv(M, TILE_M)
    tiles_n = tl.cdiv(N, TILE_N)
    per_group = SUPER * tiles_n
    first_m = (program // per_group) * SUPER
    group_rows = min(tiles_m - first_m, SUPER)
    tile_m = first_m + (program % per_group) % group_rows
    tile_n = (program % per_group) // group_rows
    rows = tile_m * TILE_M + tl.arange(0, TILE_M)
    cols = tile_n * TILE_N + tl.arange(0, TILE_N)
    depth = tl.arange(0, TILE_K)
    total = tl.zeros((TILE_M, TILE_N), dtype=tl.float32)
    for start in range(0, K, TILE_K):
        a = tl.load(a_ptr + rows[:, None] * a_row + (start + depth)[None, :] * a_col,
                    mask=(rows[:, None] < M) & ((start + depth)[None, :] < K), other=0.0)
        b = tl.load(b_ptr + (start + depth)[:, None] * b_row + cols[None, :] * b_col,
                    mask=((start + depth)[:, None] < K) & (cols[None, :] < N), other=0.0)
        total = tl.dot(a, b, total)
    if ACTIVATION == "squared_relu":
        total = squared_relu(total)
    tl.store(c_ptr + rows[:, None] * c_row + cols[None, :] * c_col, total.to(tl.float16),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def matmul(a, b, activation=""):
    (M, K), (_, N) = a.shape, b.shape
    c = torch.empty((M, N), device=a.device, dtype=torch.float16)
    grid = lambda meta: (triton.cdiv(M, meta["TILE_M"]) * triton.cdiv(N, meta["TILE_N"]), )
    matmul_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
                        c.stride(0), c.stride(1), ACTIVATION=activation)
    return c


# --- a chunked scan, as flash-linear-attention writes its kernels ------------------------------
@triton.heuristics({"HAS_OFFSET": lambda args: args["offset"] is not None})
@triton.jit
def chunked_cumsum_kernel(x_ptr, out_ptr, offset, length, width, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                          HAS_OFFSET: tl.constexpr):
    row = tl.program_id(0)
    carry = tl.zeros([BLOCK], dtype=tl.float32)
    if HAS_OFFSET:
        carry += tl.load(offset + tl.arange(0, BLOCK), mask=tl.arange(0, BLOCK) < width, other=0.0)
    for chunk in range(tl.cdiv(length, CHUNK)):
        start = chunk.to(tl.int32) * CHUNK          # the loop counter is a Triton scalar when compiled
        source = tl.make_block_ptr(x_ptr + row * length * width, (length, width), (width, 1), (start, 0),
                                   (CHUNK, BLOCK), (1, 0))
        target = tl.make_block_ptr(out_ptr + row * length * width, (length, width), (width, 1), (start, 0),
                                   (CHUNK, BLOCK), (1, 0))
        values = tl.load(source, boundary_check=(0, 1)).to(tl.float32)
        summed = tl.cumsum(values, axis=0) + carry[None, :]
        tl.store(target, summed.to(target.dtype.element_ty), boundary_check=(0, 1))
        carry = tl.sum(values, axis=0) + carry


def chunked_cumsum(x, offset=None):
    rows, length, width = x.shape
    out = torch.empty_like(x)
    chunked_cumsum_kernel[(rows, )](x, out, offset, length, width, CHUNK=16, BLOCK=triton.next_power_of_2(width))
    return out


# --- libdevice ---------------------------------------------------------------------------
@triton.jit
def libdevice_kernel(x_ptr, asin_ptr, tanh_ptr, size, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < size)
    tl.store(asin_ptr + offsets, libdevice.asin(x), mask=offsets < size)
    tl.store(tanh_ptr + offsets, libdevice.tanh(x), mask=offsets < size)


# --- a torch operator --------------------------------------------------------------------
@triton.jit
def scaled_add_kernel(x_ptr, y_ptr, out_ptr, size, alpha, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < size
    tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=inside) + alpha * tl.load(y_ptr + offsets, mask=inside),
             mask=inside)


if hasattr(torch.library, "triton_op"):
    @torch.library.triton_op("tutorials::scaled_add", mutates_args={})
    def scaled_add(x: torch.Tensor, y: torch.Tensor, alpha: float) -> torch.Tensor:
        out = torch.empty_like(x)
        size = out.numel()
        torch.library.wrap_triton(scaled_add_kernel)[(triton.cdiv(size, 64), )](x, y, out, size, alpha, BLOCK=64)
        return out


def largest_error(result, expected):
    return (result.float() - expected.float()).abs().max().item()


def main(out_path):
    torch.manual_seed(0)
    errors, devices, scales = {}, {}, {}

    x, y = torch.rand(1000, device=DEVICE), torch.rand(1000, device=DEVICE)
    result = axpy(0.5, x, y)
    errors["elementwise"], devices["elementwise"] = largest_error(result, 0.5 * x + y), str(result.device)

    x = torch.randn(67, 181, device=DEVICE)
    result = row_softmax(x)
    errors["softmax"], devices["softmax"] = largest_error(result, torch.softmax(x, dim=1)), str(result.device)

    rows, width = 40, 96
    weight = torch.rand(width, device=DEVICE, requires_grad=True)
    bias = torch.rand(width, device=DEVICE, requires_grad=True)
    x = (-2.3 + 0.5 * torch.randn(rows, width, device=DEVICE)).requires_grad_()
    dy = 0.1 * torch.randn(rows, width, device=DEVICE)
    ours = TritonLayerNorm.apply(x, weight, bias, 1e-5)
    ours.backward(dy)
    grads = [t.grad for t in (x, weight, bias)]
    x.grad = weight.grad = bias.grad = None
    theirs = torch.nn.functional.layer_norm(x, (width, ), weight, bias, 1e-5)
    theirs.backward(dy)
    errors["layer_norm_forward"] = largest_error(ours, theirs)
    errors["layer_norm_backward"] = max(largest_error(g, t.grad) for g, t in zip(grads, (x, weight, bias)))
    devices["layer_norm"] = str(grads[1].device)

    a = torch.randn((96, 80), device=DEVICE, dtype=torch.float16)
    b = torch.randn((80, 72), device=DEVICE, dtype=torch.float16)
    product = a.float() @ b.float()
    result = matmul(a, b)
    errors["matmul"], devices["matmul"] = largest_error(result, product.half()), str(result.device)
    errors["matmul_squared_relu"] = largest_error(matmul(a, b, "squared_relu"), product.relu().square().half())
    scales["matmul"] = product.abs().max().item()
    scales["matmul_squared_relu"] = product.relu().square().max().item()

    x = torch.randn(3, 37, 24, device=DEVICE)
    offset = torch.randn(24, device=DEVICE)
    errors["chunked_scan"] = max(largest_error(chunked_cumsum(x), x.cumsum(1)),
                                 largest_error(chunked_cumsum(x, offset), x.cumsum(1) + offset))
    bf16 = x.bfloat16()
    errors["chunked_scan_bfloat16"] = largest_error(chunked_cumsum(bf16), bf16.float().cumsum(1).bfloat16())
    scales["chunked_scan_bfloat16"] = bf16.float().cumsum(1).abs().max().item()

    x = torch.rand(500, device=DEVICE) * 1.8 - 0.9
    asin, tanh = torch.empty_like(x), torch.empty_like(x)
    libdevice_kernel[(triton.cdiv(500, 128), )](x, asin, tanh, 500, BLOCK=128)
    errors["libdevice"] = max(largest_error(asin, torch.asin(x)), largest_error(tanh, torch.tanh(x)))

    if hasattr(torch.library, "triton_op"):
        x, y = torch.randn(300, device=DEVICE), torch.randn(300, device=DEVICE)
        result = torch.ops.tutorials.scaled_add(x, y, 0.5)
        errors["triton_op"], devices["triton_op"] = largest_error(result, x + 0.5 * y), str(result.device)

    with open(out_path, "w") as out:
        json.dump({"errors": errors, "scales": scales, "devices": devices, "cuda_target": triton.runtime.driver.active.get_current_target().backend,
                   "tuned": matmul_kernel.best_config.kwargs}, out)


if __name__ == "__main__":
    main(sys.argv[1])
