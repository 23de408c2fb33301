"""autocast and GradScaler spelled for CUDA, translated as asked. What they compute in by
default, where the target computes float16 slowly, is tests/test_precision.py's."""

import warnings

import pytest
import torch

pytestmark = pytest.mark.host          # autocast's dtype follows the precision policy


@pytest.fixture
def shim():
    import cudashim
    cudashim.activate("cpu", amp_dtype="as-asked")
    yield cudashim
    cudashim.deactivate()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_autocast_cuda_runs_on_the_target_with_the_dtype(shim, dtype):
    a = torch.randn(4, 4, device="cuda")
    with torch.autocast("cuda", dtype=dtype):
        assert (a @ a).dtype == dtype
        assert torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda") == dtype
    with torch.amp.autocast(device_type="cuda", dtype=dtype):
        assert (a @ a).dtype == dtype


def test_autocast_cuda_in_float32_computes_in_float32(shim):
    """CUDA's autocast takes dtype=torch.float32 (llm.c's default) and computes the ops it casts in
    float32; the host's autocast refuses float32. Such a region ran in bfloat16 before, with a
    warning: other numbers than CUDA's, and bfloat16's slow kernels where the host has them."""
    a = torch.randn(4, 4, device="cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cuda", dtype=torch.float32):
            assert (a @ a).dtype == torch.float32
            assert torch.nn.functional.linear(a, a).dtype == torch.float32
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            assert (a @ a).dtype == torch.float16                  # the next region as asked


def test_cuda_amp_spellings(shim):
    a = torch.randn(4, 4).cuda()
    with torch.cuda.amp.autocast():
        assert (a @ a).dtype == torch.float16          # CUDA's default autocast dtype

    @torch.cuda.amp.autocast(dtype=torch.bfloat16)
    def decorated(x):
        return x @ x
    assert decorated(a).dtype == torch.bfloat16
    assert isinstance(torch.cuda.amp.autocast(), torch.amp.autocast)


def test_gradscaler_both_spellings_step_on_the_target(shim):
    # a modest initial scale: 2**16 overflows fp16 here and the first step is (rightly) skipped
    for scaler in (torch.cuda.amp.GradScaler(init_scale=1024.0),
                   torch.amp.GradScaler("cuda", init_scale=1024.0),
                   torch.amp.GradScaler(init_scale=1024.0)):
        model = torch.nn.Linear(4, 1).cuda()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = model.weight.detach().clone()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(8, 4, device="cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        assert scaler.is_enabled() and scaler._device == "cpu"
        assert not torch.equal(before, model.weight)


def test_custom_fwd_and_bwd(shim):
    class Square(torch.autograd.Function):
        @staticmethod
        @torch.cuda.amp.custom_fwd(cast_inputs=torch.float32)
        def forward(ctx, x):
            ctx.save_for_backward(x)
            return x * x

        @staticmethod
        @torch.amp.custom_bwd(device_type="cuda")
        def backward(ctx, grad):
            (x,) = ctx.saved_tensors
            return 2 * x * grad

    x = torch.ones(2, requires_grad=True, device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        y = Square.apply(x)
    y.sum().backward()
    assert y.dtype == torch.float32 and x.grad.tolist() == [2.0, 2.0]
