import torch


def test_every_constructor_accepts_cuda(shim):
    calls = {
        "arange": lambda d: torch.arange(3, device=d), "empty": lambda d: torch.empty(2, device=d),
        "eye": lambda d: torch.eye(2, device=d), "full": lambda d: torch.full((2,), 1.0, device=d),
        "linspace": lambda d: torch.linspace(0, 1, 3, device=d), "ones": lambda d: torch.ones(2, device=d),
        "rand": lambda d: torch.rand(2, device=d), "randint": lambda d: torch.randint(5, (2,), device=d),
        "randn": lambda d: torch.randn(2, device=d), "randperm": lambda d: torch.randperm(3, device=d),
        "tensor": lambda d: torch.tensor([1.0], device=d), "as_tensor": lambda d: torch.as_tensor([1], device=d),
        "zeros_like": lambda d: torch.zeros_like(torch.ones(2), device=d),
        "empty_strided": lambda d: torch.empty_strided((2,), (1,), device=d),
        "tril_indices": lambda d: torch.tril_indices(3, 3, device=d),
        "fftfreq": lambda d: torch.fft.fftfreq(4, device=d),
        "hann_window": lambda d: torch.hann_window(4, device=d),
        "normal": lambda d: torch.normal(0.0, 1.0, (2,), device=d),
        "sparse_coo_tensor": lambda d: torch.sparse_coo_tensor([[0]], [1.0], (2,), device=d),
    }
    for name, make in calls.items():
        for spec in ("cuda", "cuda:0", torch.device("cuda"), 0):
            t = make(spec)
            assert t.device.type == "cpu" and t.is_cuda, (name, spec)


def test_tensor_to_cuda_and_new_methods(shim):
    t = torch.ones(2, dtype=torch.float64)
    assert t.cuda().is_cuda and t.cuda(0).device.type == "cpu"
    assert t.to("cuda", torch.float16).dtype == torch.float16
    assert t.to(device="cuda:0", dtype=torch.float32).dtype == torch.float32
    assert t.to(0).device.type == "cpu" and t.to(torch.float16).dtype == torch.float16
    assert t.to(torch.ones(1, dtype=torch.int32)).dtype == torch.int32
    for name in ("new_empty", "new_zeros", "new_ones"):
        assert getattr(t, name)((2,), device="cuda").is_cuda
    assert t.new_full((2,), 3.0, device="cuda").sum() == 6
    assert t.new_tensor([1, 2], device="cuda").is_cuda


def test_is_cuda_answers_by_who_asks(shim):
    t = torch.ones(2)
    assert t.is_cuda is True
    assert t.get_device() == 0
    import types
    torch_internal = types.FunctionType(
        compile("def ask(t): return t.is_cuda, t.get_device()", "<torch>", "exec").co_consts[0],
        {"__name__": "torch.nn.functional"})
    assert torch_internal(t) == (False, -1)


def test_is_cuda_can_be_answered_honestly():
    import cudashim
    cudashim.activate("cpu", honest="is_cuda")
    assert torch.zeros(1, device="cuda").is_cuda is False
    cudashim.deactivate()


def test_legacy_tensor_types(shim):
    t = torch.ones(2).type("torch.cuda.HalfTensor")
    assert t.dtype == torch.float16 and t.is_cuda
    assert torch.ones(2).type(torch.cuda.DoubleTensor).dtype == torch.float64
    assert torch.ones(2).type() == "torch.cuda.FloatTensor"
    assert torch.ones(2).type("torch.IntTensor").dtype == torch.int32
    f = torch.cuda.FloatTensor(2, 3)
    assert f.shape == (2, 3) and isinstance(f, torch.cuda.FloatTensor)
    assert torch.cuda.LongTensor([1, 2]).tolist() == [1, 2]
    assert not isinstance(torch.ones(2, dtype=torch.int64), torch.cuda.FloatTensor)
    assert torch.cuda.FloatStorage(4).size() == 4


def test_modules_move_with_every_spelling(shim):
    for move in (lambda m: m.to(0), lambda m: m.cuda(), lambda m: m.to("cuda:0"),
                 lambda m: m.to(device="cuda", dtype=torch.float64), lambda m: m.cuda(0)):
        m = move(torch.nn.Linear(2, 2))
        assert next(m.parameters()).is_cuda
    with torch.device("meta"):
        lazy = torch.nn.Linear(2, 2)
    assert lazy.to_empty(device="cuda").weight.device.type == "cpu"


def test_default_device_generator_and_device_module(shim):
    with torch.device("cuda"):
        assert torch.zeros(1).is_cuda
    torch.set_default_device("cuda")
    assert torch.empty(1).device.type == "cpu"
    torch.set_default_device(None)
    g = torch.Generator(device="cuda")
    assert isinstance(g, torch.Generator) and g.device.type == "cpu"
    g.manual_seed(3)
    assert torch.equal(torch.rand(3, generator=g, device="cuda"),
                       torch.rand(3, generator=torch.Generator().manual_seed(3)))
    assert torch.get_device_module("cuda") is torch.cuda
    real_cuda_device = shim.get_original(torch, "device")("cuda:0")
    assert torch.get_device_module(real_cuda_device) is torch.cuda


def test_pin_memory_and_dataloader(shim):
    t = torch.ones(3)
    pinned = t.pin_memory()            # a copy, as CUDA's, known to be pinned host memory
    assert pinned is not t and pinned.is_pinned() and not t.is_pinned() and pinned.pin_memory() is pinned
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(4)),
                                         batch_size=2, pin_memory=True, pin_memory_device="cuda")
    assert [b[0].tolist() for b in loader] == [[0, 1], [2, 3]]


def test_streams_and_record_stream(shim):
    s = torch.cuda.Stream()
    t = torch.ones(2, device="cuda")
    t.record_stream(s)
    with torch.cuda.stream(s):
        assert torch.cuda.current_stream() is s
    assert torch.cuda.current_stream() is torch.cuda.default_stream()
    s.wait_stream(torch.cuda.current_stream())
    assert s.query()
    x = torch.ones(1).cuda()
    x.storage().cuda()
    assert torch.UntypedStorage(4).cuda().device.type == "cpu"
