"""cudashim.kernels: bit-exact with numpy; the registry picks and checks fast paths."""

import logging

import numpy as np
import pytest
import torch

from cudashim import kernels
from cudashim.kernels import bits, registry

pytestmark = pytest.mark.host          # the host kernels choose their variant by the CPU's instruction set

LENGTHS = [0, 1, 7, 8, 9, 15, 17, 63, 64, 65, 1003, 8 * (1 << 19) + 5, 8 * (1 << 20) + 13]


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", [np.bool_, np.uint8, np.int32, np.int64])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_packbits_matches_numpy_bit_for_bit(n, dtype, bitorder):
    values = np.random.default_rng(n).integers(-2, 3, n).astype(dtype)
    expected = np.packbits(values, bitorder=bitorder)
    got = kernels.packbits(torch.from_numpy(values), bitorder=bitorder)
    assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), expected)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_unpackbits_matches_numpy_with_every_count(n, bitorder):
    packed = np.packbits(np.random.default_rng(n).integers(0, 2, n).astype(bool), bitorder=bitorder)
    for count in (None, 0, 3, n, n + 11, -1, -(8 * packed.size), -(8 * packed.size) - 1):
        if packed.size == 0 and count:
            continue                   # numpy leaves the padding of an empty input uninitialised
        try:
            expected = np.unpackbits(packed, count=count, bitorder=bitorder)
        except ValueError as error:
            with pytest.raises(ValueError, match=str(error)):
                kernels.unpackbits(torch.from_numpy(packed), count, bitorder)
            continue
        got = kernels.unpackbits(torch.from_numpy(packed), count, bitorder)
        assert got.dtype == torch.uint8 and np.array_equal(got.numpy(), expected), count


def test_non_contiguous_and_offset_inputs():
    x = torch.rand(300) < 0.5
    for view in (x[3:259], x[::3], x.view(10, 30).t()):
        assert np.array_equal(kernels.packbits(view).numpy(), np.packbits(view.contiguous().numpy()))


def test_bad_inputs_fail_as_numpy_does():
    with pytest.raises(TypeError, match="integer or boolean"):
        kernels.packbits(torch.ones(3))
    with pytest.raises(TypeError, match="unsigned byte"):
        kernels.unpackbits(torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="'order' must be either 'little' or 'big'"):
        kernels.packbits(torch.ones(3, dtype=torch.bool), bitorder="middle")


def test_pack_signs_counts_zero_as_positive_and_round_trips():
    x = torch.tensor([0.5, -1.0, 0.0, -0.0, 2.0, -3.0, 1e-30, -1e-30, 4.0])
    assert np.array_equal(kernels.pack_signs(x).numpy(), np.packbits(x.numpy() >= 0))
    assert kernels.unpack_signs(kernels.pack_signs(x), count=9).tolist() == \
        [1.0, -1.0, 1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0]
    with pytest.raises(TypeError):
        kernels.pack_signs(torch.ones(3, dtype=torch.int64))


def test_a_registered_fast_path_is_used_once_it_proves_equal():
    calls = []

    def user_packbits(x, bitorder="big"):
        calls.append(x.numel())
        return bits.packbits(x, bitorder)

    kernels.register_kernel("packbits", "cpu", user_packbits, name="user packbits")
    kernels.packbits(torch.ones(20, dtype=torch.bool))
    assert calls[-1] == 20 and "user packbits: ok" in kernels.kernel_info()["packbits"]["cpu"]


def test_a_fast_path_that_disagrees_is_refused(caplog):
    caplog.set_level(logging.WARNING, logger="cudashim.kernels")
    wrong = lambda x, bitorder="big": bits.packbits(x, "little")   # noqa: E731
    kernels.register_kernel("packbits", "cpu", wrong, name="wrong order")
    x = torch.tensor([1, 0, 0, 0, 0, 0, 0, 0], dtype=torch.bool)
    assert kernels.packbits(x).tolist() == [128]              # the portable answer
    assert "disagrees" in kernels.kernel_info()["packbits"]["cpu"] and "wrong order" in caplog.text


def test_an_unavailable_fast_path_says_why():
    kernels.register_kernel("packbits", "cpu", bits.packbits, available=lambda: "no such library")
    assert kernels.packbits(torch.ones(8, dtype=torch.bool)).tolist() == [255]
    assert kernels.kernel_info()["packbits"]["cpu"].endswith("no such library")


def test_registering_an_unknown_op_names_the_known_ones():
    with pytest.raises(KeyError, match="packbits"):
        kernels.register_kernel("popcount", "cpu", bits.packbits)


def _builtin_fast_paths():
    return [(name, device_type) for name, op in sorted(registry.OPS.items())
            for device_type in sorted(op.fast_paths)]


@pytest.mark.parametrize("op_name, device_type", _builtin_fast_paths())
def test_builtin_fast_paths_match_the_portable_version(op_name, device_type):
    op = registry.OPS[op_name]
    fast = op.fast_paths[device_type]
    reason = fast.available()
    if reason is not None:
        pytest.skip(f"{fast.name} on {device_type}: {reason}")
    device = torch.device(device_type)
    for args in op.probe(device):
        assert torch.equal(fast.function(*args).cpu(), op.portable(*args).cpu())
