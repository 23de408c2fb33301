"""One process, several devices: nn.DataParallel, nn.parallel, torch.cuda.comm and
hand-placed model parallelism, on the CPU's virtual devices (``--device-count 2``).

The same programs run on torchvulkan and on cudashim's test accelerator in
test_device_targets.py, where a tensor left in host memory or on the wrong device fails.
"""

import json

import pytest

from conftest import python

TWO = ("--device-count", "2")


def _run(program, *args, options=TWO):
    result = python("-m", "cudashim", *options, f"tests/programs/{program}.py", *args)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def semantics(tmp_path, options=TWO):
    _run("data_parallel_semantics", str(tmp_path / "semantics.json"), options=options)
    return json.loads((tmp_path / "semantics.json").read_text())


# What every target must answer as CUDA does on two GPUs (values that are the same everywhere).
EXPECTED_SEMANTICS = {
    "device_ids": [0, 1], "replica_devices": [0, 1], "batchnorm_batches_tracked": 1,
    "replica_error": "Caught ValueError in replica 1 on device 1.",
    "state_dict_keys": ["module.0.bias", "module.0.weight"], "broadcast_coalesced": [2, 2],
    "reduce_add": [3.0] * 3, "reduce_add_coalesced": [[3.0] * 3] * 2, "scatter_sizes": [3, 7],
    "gather": [1.0] * 3 + [2.0] * 3, "gather_out": [1.0] * 3 + [2.0] * 3,
}
CHECKS = ("loss_matches_one_device", "grads_match_one_device", "grads_on_first_device",
          "host_input_output_on_device", "host_input_matches", "batchnorm_per_replica_statistics",
          "batchnorm_running_mean_from_first_replica", "kwargs_scattered", "dim_1",
          "autocast_as_in_caller", "no_grad_forward", "checkpoint_round_trip", "module_access",
          "data_parallel_function", "replicas_own_parameters", "by_hand", "gathered_on_host",
          "broadcast_keeps_source", "broadcast_copies_are_their_own")


def check_semantics(seen):
    failed = [name for name in CHECKS if seen[name] is not True]
    assert not failed, failed
    assert {k: seen[k] for k in EXPECTED_SEMANTICS} == EXPECTED_SEMANTICS


def test_data_parallel_keeps_cudas_semantics_on_two_virtual_devices(tmp_path):
    seen = semantics(tmp_path)
    check_semantics(seen)
    assert seen["reduce_add_host_input"] is None        # host memory is every virtual device here


def test_the_data_parallel_tutorial_trains_as_on_one_device(tmp_path):
    _run("data_parallel_tutorial", str(tmp_path / "two.json"))
    _run("data_parallel_tutorial", str(tmp_path / "one.json"), options=())
    two, one = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("two", "one"))
    assert two["wrapped"] and not one["wrapped"]
    assert two["sizes"] == [5] * 4 + [15] * 12 and one["sizes"] == [10] * 2 + [30] * 6
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)


def test_the_model_parallel_tutorial_trains_as_on_one_device(tmp_path):
    _run("model_parallel_tutorial", str(tmp_path / "losses.json"))
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert losses["model_parallel"] == pytest.approx(losses["single"], rel=1e-5)
    assert losses["pipeline"] == pytest.approx(losses["single"], rel=1e-5)
    assert losses["single"][-1] < losses["single"][0]


def test_dcgan_with_two_gpus_needs_two_devices_and_says_how(tmp_path):
    trained = _run("dcgan_data_parallel", str(tmp_path / "two.json"), "--ngpu", "2")
    assert "[2/3] Loss_D" in trained.stdout
    one_device = python("-m", "cudashim", "tests/programs/dcgan_data_parallel.py",
                        str(tmp_path / "one.json"), "--ngpu", "2")
    assert one_device.returncode != 0
    last = one_device.stderr.strip().splitlines()[-1]
    assert "CUDA error: invalid device ordinal 1" in last and "--device-count" in last, last


def test_torch_cuda_comm_refuses_what_cuda_refuses(shim):
    import torch
    from torch.cuda import comm
    x = torch.ones(4).cuda()
    with pytest.raises(RuntimeError, match="Exactly one of 'devices' and 'out'"):
        comm.broadcast(x)
    with pytest.raises(RuntimeError, match="Expected devices and chunk_sizes to be of same length"):
        comm.scatter(x, [0], chunk_sizes=[2, 2])
    with pytest.raises(ValueError, match="input 1 has invalid size: got 3, but expected 4"):
        comm.reduce_add([x, torch.ones(3).cuda()], 0)
    with pytest.raises(RuntimeError, match="invalid device ordinal 1"):     # one device configured
        comm.broadcast(x, [0, 1])
    with pytest.raises(ValueError, match="Expected a cuda device, but got: meta"):
        comm.broadcast(x, ["meta"])


def test_deactivation_gives_torch_its_own_parallel_code_back():
    import sys
    import torch
    import cudashim
    parallel = sys.modules["torch.nn.parallel"]
    names = {module: dict(vars(sys.modules[module])) for module in (
        "torch.nn.parallel.comm", "torch.nn.parallel._functions", "torch.nn.parallel.scatter_gather",
        "torch.nn.parallel.replicate", "torch.nn.parallel.data_parallel", "torch.nn.parallel.parallel_apply")}
    apply = parallel.parallel_apply
    with cudashim.activated("cpu", device_count=2):
        assert sys.modules["torch.nn.parallel._functions"].Broadcast is not names[
            "torch.nn.parallel._functions"]["Broadcast"]
        torch.nn.DataParallel(torch.nn.Linear(2, 2))(torch.ones(4, 2))
    assert parallel.parallel_apply is apply
    for module, before in names.items():
        after = vars(sys.modules[module])
        assert all(after[name] is value for name, value in before.items()), module
