"""The ops torch computes on the sparse compressed layouts (CSR, CSC, BSR, BSC): those with a
kernel on torch's ``SparseCsrCPU`` dispatch key, in torch 2.4 to 2.14. A target without kernels
of its own for these layouts gets one for each (``patches/layouts.py``).
``tests/test_kernel_gaps.py`` reads torch's dispatcher and fails when a torch has one more.
Listed here, not read from the dispatcher at activation: reading every op name takes 14 ms.
"""

OPS = tuple("""
    _conj_physical _nnz _pin_memory _sparse_csr_prod.dim_dtype _sparse_csr_sum.dim_dtype
    _sparse_mm_reduce_impl _sparse_mm_reduce_impl_backward _to_dense _to_sparse
    _to_sparse.sparse_dim _to_sparse_bsc _to_sparse_bsr _to_sparse_csc _to_sparse_csr abs
    abs.out abs_ add.Tensor add.out add_.Tensor addmm addmm.out addmv.out angle angle.out asin
    asin.out asin_ asinh asinh.out asinh_ atan atan.out atan_ atanh atanh.out atanh_
    ccol_indices ceil ceil.out ceil_ clone col_indices conj_physical.out conj_physical_ copy_
    crow_indices deg2rad deg2rad.out deg2rad_ dense_dim empty.memory_format empty_like erf
    erf.out erf_ erfinv erfinv.out erfinv_ expm1 expm1.out expm1_ fill_.Scalar floor floor.out
    floor_ frac frac.out frac_ is_pinned isinf isnan isneginf isneginf.out isposinf isposinf.out
    log1p log1p.out log1p_ mm mm.out mul.Scalar mul.Tensor mul.out mul_.Scalar mul_.Tensor neg
    neg.out neg_ normal_ rad2deg rad2deg.out rad2deg_ relu relu_ resize_ resize_as_sparse_ round
    round.out round_ row_indices select.int select_copy.int sgn sgn.out sgn_ sign sign.out sign_
    signbit signbit.out sin sin.out sin_ sinh sinh.out sinh_ sparse_dim sparse_mask
    sparse_sampled_addmm sparse_sampled_addmm.out sqrt sqrt.out sqrt_ sum sum.dim_IntList tan
    tan.out tan_ tanh tanh.out tanh_ threshold_backward threshold_backward.grad_input
    triangular_solve.X trunc trunc.out trunc_ values zero_
""".split())

# Ops that read or write only the tensor's own parts (its index and value tensors, which are
# device tensors): torch's host kernel for them touches no data, so they run on the device.
ON_THE_DEVICE = ("crow_indices", "col_indices", "ccol_indices", "row_indices", "values", "_nnz",
                 "sparse_dim", "dense_dim", "is_pinned", "_pin_memory")

# What checks a loaded checkpoint's compressed tensors: torch 2.4 and 2.7 refuse parts of any
# device but their own ("device type of values (xpu) must be CPU or CUDA or Meta"; 2.13 accepts
# them). On the target's dense key they check host copies of the parts, as torch's own check
# reads them on the host. (A constructor's ``check_invariants=True`` checks without dispatch,
# and still refuses there.)
VALIDATIONS = ("_validate_sparse_compressed_tensor_args", "_validate_sparse_csr_tensor_args",
               "_validate_sparse_csc_tensor_args", "_validate_sparse_bsr_tensor_args",
               "_validate_sparse_bsc_tensor_args")
