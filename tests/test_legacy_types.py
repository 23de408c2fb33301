"""Legacy CUDA tensor types as values, the way reference inference code uses them."""

import warnings

import pytest
import torch

from conftest import use_fake_vendor

warnings.filterwarnings("ignore", message=".*set_default_tensor_type.*")


class TinyLM(torch.nn.Module):
    """What reference LLM inference code builds after setting the default tensor type:
    parameters and caches made with no dtype and no device."""

    def __init__(self, vocab=16, width=8, max_len=4):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.proj = torch.nn.Linear(width, vocab, bias=False)
        self.cache = torch.zeros(1, max_len, width)
        self.freqs = 1.0 / (10000 ** (torch.arange(0, width, 2).float() / width))

    def forward(self, tokens):
        h = self.embed(tokens)
        self.cache[:, : tokens.shape[1]] = h
        return self.proj(h)


def test_a_cuda_default_tensor_type_builds_the_model_in_its_dtype_on_the_target(shim):
    torch.set_default_tensor_type(torch.cuda.HalfTensor)
    model = TinyLM()
    weight = model.proj.weight
    assert weight.dtype == torch.float16 and model.cache.dtype == torch.float16
    assert weight.is_cuda and isinstance(weight, torch.cuda.HalfTensor)
    assert weight.type() == "torch.cuda.HalfTensor" and torch.Tensor(2).type() == "torch.cuda.HalfTensor"
    assert model(torch.tensor([[1, 2]]).cuda()).dtype == torch.float16

    torch.set_default_dtype(torch.float32)          # the dtype moves, the "device" stays CUDA
    assert torch.empty(1).type() == "torch.cuda.FloatTensor"
    torch.set_default_tensor_type("torch.cuda.BFloat16Tensor")
    assert torch.get_default_dtype() == torch.bfloat16
    torch.set_default_tensor_type(torch.FloatTensor)
    assert torch.empty(1).type() == "torch.cuda.FloatTensor" and torch.empty(1).dtype == torch.float32


def test_every_legacy_type_converts_checks_and_names_its_dtype(shim):
    from cudashim import legacy_types

    x = torch.arange(3).cuda()
    for name, dtype in legacy_types.TENSOR_CLASSES.items():
        legacy = getattr(torch.cuda, name)
        for spelling in (legacy, f"torch.cuda.{name}"):
            converted = x.type(spelling)
            assert converted.dtype == dtype and converted.is_cuda, spelling
        assert isinstance(converted, legacy) and converted.type() == f"torch.cuda.{name}"
        assert not isinstance(x.type(torch.float64 if dtype != torch.float64 else torch.float32), legacy)


def test_non_floating_default_types_fail_as_torch_fails(shim):
    with pytest.raises(TypeError, match="only floating-point types are supported as the default type"):
        torch.set_default_tensor_type(torch.cuda.LongTensor)
    assert torch.get_default_dtype() == torch.float32


def test_on_an_accelerator_the_default_type_sets_the_default_device_until_taken_back():
    import cudashim
    use_fake_vendor("npu")
    cudashim.activate()
    assert cudashim.current_backend().name == "npu"
    torch.set_default_tensor_type(torch.cuda.BFloat16Tensor)
    model = TinyLM()
    assert model.proj.weight.device.type == "npu" and model.cache.device.type == "npu"
    assert model.proj.weight.dtype == torch.bfloat16
    assert isinstance(model.cache, torch.cuda.BFloat16Tensor)
    torch.set_default_tensor_type(torch.FloatTensor)
    assert torch.empty(1).device.type == "cpu" and torch.empty(1).dtype == torch.float32

    torch.set_default_tensor_type(torch.cuda.FloatTensor)
    assert torch.empty(1).device.type == "npu"
    cudashim.deactivate()                          # cudashim's default device goes with it
    assert torch.empty(1).device.type == "cpu"
