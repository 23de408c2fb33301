"""Storages tagged cuda:N load onto the target; what cudashim saves loads anywhere."""

import pytest
import torch

from conftest import python


@pytest.fixture
def cuda_checkpoint(tmp_path):
    """A checkpoint whose storages carry 'cuda:0' tags, byte for byte as a GPU machine
    writes them (the tag is the only thing that differs)."""
    import torch.serialization as serialization
    path = tmp_path / "from_gpu.pt"
    original = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        torch.save({"w": torch.arange(6, dtype=torch.float32).view(2, 3), "step": 5}, path)
    finally:
        serialization.location_tag = original
    with pytest.raises(RuntimeError):         # plain torch on this CPU cannot load it
        torch.load(path)
    return path


@pytest.mark.parametrize("map_location", [
    None, "cuda", "cuda:0", "cpu", "__device__", "__dict__", "__lambda__", "__lambda_none__"])
def test_cuda_tagged_storages_load_onto_the_target(cuda_checkpoint, shim, map_location):
    map_location = {
        "__device__": torch.device("cuda:0"),
        "__dict__": {"cuda:0": "cuda:0"},
        "__lambda__": lambda storage, loc: storage.cuda(0),
        "__lambda_none__": lambda storage, loc: None,
    }.get(map_location, map_location) if isinstance(map_location, str) else map_location
    state = torch.load(cuda_checkpoint, map_location=map_location)
    assert state["w"].is_cuda and state["w"].device.type == "cpu" and state["step"] == 5
    assert torch.equal(state["w"], torch.arange(6.0).view(2, 3))


def test_what_is_saved_under_the_shim_loads_with_plain_torch_bit_for_bit(shim, tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).cuda()
    path = tmp_path / "shimmed.pt"
    torch.save(model.state_dict(), path)
    expected = torch.cat([p.detach().flatten() for p in model.state_dict().values()])
    torch.save(expected, tmp_path / "expected.pt")
    code = (f"import torch; s = torch.load({str(path)!r}); e = torch.load({str(tmp_path / 'expected.pt')!r});"
            "t = torch.cat([v.flatten() for v in s.values()]);"
            "assert t.numpy().tobytes() == e.numpy().tobytes(); print('ok')")
    result = python("-c", code)
    assert result.stdout.strip() == "ok", result.stderr


def test_torch_package_restores_cuda_tagged_storages_and_deactivation_forgets_how(cuda_checkpoint, tmp_path):
    """The deserializer is torch's own hook (register_package): ``torch.package`` reaches it
    too, and deactivation leaves torch's list of deserializers as it was."""
    import torch.serialization as serialization
    from torch.package import PackageExporter, PackageImporter

    import cudashim
    before = list(serialization._package_registry)
    package = tmp_path / "weights.pt"
    original = serialization.location_tag
    serialization.location_tag = lambda storage: "cuda:0"
    try:
        with PackageExporter(package) as exporter:
            exporter.save_pickle("weights", "w.pkl", {"w": torch.arange(4.0)})
    finally:
        serialization.location_tag = original
    cudashim.activate("cpu")
    loaded = PackageImporter(package).load_pickle("weights", "w.pkl")
    assert loaded["w"].is_cuda and torch.equal(loaded["w"], torch.arange(4.0))
    assert torch.load(cuda_checkpoint)["step"] == 5
    cudashim.deactivate()
    assert serialization._package_registry == before
    with pytest.raises(RuntimeError):
        torch.load(cuda_checkpoint)
