import pytest
import torch


@pytest.mark.parametrize("spec", ["cuda:x", "cuda:-1", "cudax", "cuda:1:2", "gpu"])
def test_malformed_specs_fail_exactly_as_torch_fails(shim, spec):
    real = shim.get_original(torch, "device")
    with pytest.raises(RuntimeError) as expected:
        real(spec)
    for attempt in (lambda: torch.zeros(1, device=spec), lambda: torch.ones(1).to(spec),
                    lambda: torch.device(spec)):
        with pytest.raises(type(expected.value)) as got:
            attempt()
        assert str(got.value) == str(expected.value)


def test_out_of_range_index_is_one_clear_error(shim):
    for attempt in (lambda: torch.zeros(1, device="cuda:1"), lambda: torch.ones(1).cuda(3),
                    lambda: torch.ones(1).to(2), lambda: torch.cuda.set_device(5)):
        # torch.AcceleratorError, as CUDA raises, naming the setting that makes more devices
        with pytest.raises(torch.AcceleratorError,
                           match=r"invalid device ordinal .*--device-count N \(CUDASHIM_DEVICE_COUNT=N\)"):
            attempt()


@pytest.mark.parametrize("spec", ["cuda", "cuda:0", 0, "cpu"])
def test_every_spelling_lands_on_the_target(shim, spec):
    spec = torch.device(spec) if spec == "cuda:0" else spec
    assert torch.zeros(2, device=spec).device == torch.device("cpu")
    assert torch.ones(2).to(spec).device.type == "cpu"


def test_torch_device_proxy_keeps_isinstance_and_equality(shim):
    d = torch.device("cuda", 0)
    assert isinstance(d, torch.device) and type(d) is shim.get_original(torch, "device")
    assert torch.ones(1, device="cuda").device == torch.device("cuda")
    assert torch.device(0) == torch.device("cpu")
    assert torch.device("meta").type == "meta"


def test_translator_caches_and_leaves_non_cuda_specs_alone(shim):
    from cudashim.translation import DeviceTranslator
    t = DeviceTranslator(shim.current_backend())
    cpu = torch.device("cpu")
    assert t.translate("cpu") == "cpu" and t.translate(cpu) is cpu
    assert t.translate("cuda:0") is t.translate("cuda:0")
    assert t.translate(True) is True             # bools are not device indices
    assert t.translate([1, 2]) == [1, 2]         # unhashable: not a device spec
    assert "cuda:0" in t.cache


def test_a_path_containing_cuda_is_not_a_device(shim, tmp_path):
    path = tmp_path / "runs" / "cuda_test" / "ckpt.pt"
    path.parent.mkdir(parents=True)
    torch.save({"w": torch.arange(3)}, str(path))
    loaded = torch.load(str(path), map_location="cuda")
    assert torch.equal(loaded["w"], torch.arange(3)) and path.exists()


def test_virtual_devices_all_map_to_the_cpu():
    import cudashim
    cudashim.activate("cpu", device_count=2)
    assert torch.cuda.device_count() == 2
    assert torch.zeros(1, device="cuda:1").device.type == "cpu"
    torch.cuda.set_device(1)
    assert torch.cuda.current_device() == 1
    with torch.cuda.device(0):
        assert torch.cuda.current_device() == 0
    assert torch.cuda.current_device() == 1
    cudashim.deactivate()


def test_a_device_sent_to_another_process_arrives_as_it_was():
    """multiprocessing's pickler (mp.spawn's arguments, queues) carries a device untranslated:
    a CUDA device a framework holds stays CUDA; torch.save's pickles stay plain torch."""
    import io
    import pickle
    from multiprocessing.reduction import ForkingPickler
    import torch
    import cudashim
    cuda = torch.device("cuda", 1)
    cudashim.activate("cpu", device_count=2)
    try:
        assert pickle.loads(ForkingPickler.dumps(cuda)) == torch._C.device("cuda", 1)
        assert pickle.loads(ForkingPickler.dumps(torch.device("cuda"))).type == "cpu"
        assert pickle.loads(pickle.dumps(cuda)).type == "cpu"       # plain pickle: torch.device, translated
        buffer = io.BytesIO()
        torch.save({"device": cuda}, buffer)
        assert b"cudashim" not in buffer.getvalue()
    finally:
        cudashim.deactivate()
    assert torch._C.device not in ForkingPickler._extra_reducers
