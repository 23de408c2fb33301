"""Multi-process: torchrun ranks and every kind of child Python come up shimmed."""

import json

import pytest

import torch

from conftest import python, torchrun, torchrun_two_nodes


def test_two_ranks_train_like_one_rank_with_the_same_data(tmp_path, one_rank_ddp):
    # The job script's NCCL interface, as NCCL reads it ("=" an exact name): gloo binds to it.
    two = torchrun("tests/programs/ddp_train.py", "--batch-size", "8", "--out", str(tmp_path / "two.pt"),
                   env={"CUDASHIM_REPORT_JSON": str(tmp_path / "report.json"), "NCCL_SOCKET_IFNAME": "=lo"})
    assert two.returncode == 0, two.stderr[-3000:]
    for rank in (0, 1):                            # one report per rank, none overwritten
        report = json.loads((tmp_path / f"report.rank{rank}.json").read_text())
        assert report["rank"] == str(rank) and report["apis"]["Tensor.cuda"]["calls"] > 0
        # set by the shimmed torchrun, which the rank inherits
        assert report["apis"]["$NCCL_SOCKET_IFNAME"]["became"].startswith("GLOO_SOCKET_IFNAME=lo")
    a, b = torch.load(tmp_path / "two.pt"), one_rank_ddp
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def _child_answers(*launcher):
    result = python(*launcher, "tests/programs/children.py", timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return dict(line.split(": ") for line in result.stdout.strip().splitlines())


def test_every_child_python_is_shimmed():
    answers = _child_answers("-m", "cudashim")
    assert len(answers) == 8 and set(answers.values()) == {"True"}, answers


def test_without_the_launcher_no_child_is_shimmed():
    answers = _child_answers()
    assert len(answers) == 8 and set(answers.values()) == {"False"}, answers


def test_a_failing_rank_fails_torchrun_with_its_error(tmp_path):
    result = torchrun("tests/programs/failing_rank.py", timeout=240,
                      env={"CUDASHIM_REPORT_JSON": str(tmp_path / "report.json")})
    assert result.returncode != 0
    assert "ValueError: rank 1 gives up (local rank 1)" in result.stderr
    # the failing rank still wrote its report (rank 0 may be stopped by torchrun first)
    rank1 = json.loads((tmp_path / "report.rank1.json").read_text())
    assert rank1["rank"] == "1" and rank1["apis"]["init_process_group"]["became"] == "gloo"


def test_two_nodes_on_loopback_train_like_one_process(tmp_path, one_rank_ddp):
    nodes = torchrun_two_nodes("tests/programs/ddp_train.py", "--batch-size", "8",
                               "--out", str(tmp_path / "nodes.pt"))
    assert [code for code, _ in nodes] == [0, 0], nodes[0][1][-2000:] + nodes[1][1][-2000:]
    a, b = torch.load(tmp_path / "nodes.pt"), one_rank_ddp
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=1e-5, atol=1e-6)


def test_torchrun_started_by_a_shimmed_program_with_tcp_rendezvous(tmp_path):
    launch = ("import subprocess, sys; subprocess.run([sys.executable, '-m', 'torch.distributed.run', "
              "'--standalone', '--nproc-per-node', '2', 'tests/programs/ddp_train.py', '--tcp', "
              f"'--out', {str(tmp_path / 'tcp.pt')!r}], check=True)")
    result = python("-m", "cudashim", "-c", launch, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert set(torch.load(tmp_path / "tcp.pt")) == {"0.weight", "0.bias", "2.weight", "2.bias"}


@pytest.mark.parametrize("nproc, tensor_parallel, pipeline_parallel", [(2, 2, 1), (4, 2, 1), (4, 2, 2)])
def test_model_parallel_groups_for_members_and_non_members(nproc, tensor_parallel, pipeline_parallel):
    """Megatron-style tensor-, pipeline- and data-parallel groups (new_group on every rank,
    members or not), a one-rank group, new_subgroups, new_subgroups_by_enumeration,
    split_group and DeviceMesh sub-meshes, each running a collective."""
    result = torchrun("tests/programs/model_parallel_groups.py", str(tensor_parallel),
                      str(pipeline_parallel), nproc=nproc, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("ran collectives") == nproc


def test_a_gpt_ddp_trainer_ends_its_groups_before_the_interpreter_finalises(tmp_path):
    """Gloo's threads end with the group's last reference. torch keeps one past
    destroy_process_group() (function defaults taken when DDP imports torch._dynamo), so
    natively the group ends in finalisation, where its threads can abort the process."""
    result = torchrun("tests/programs/gpt_ddp.py", "--out", str(tmp_path / "gpt.pt"),
                      "--exit-report", str(tmp_path / "exit"))
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        at_exit = json.loads((tmp_path / f"exit.rank{rank}.json").read_text())
        assert at_exit == {"initialized": False, "threads": []}, (rank, at_exit)
    assert set(torch.load(tmp_path / "gpt.pt")) == {"model", "optimizer"}


@pytest.mark.slow
def test_a_gpt_ddp_trainer_exits_cleanly_run_after_run(tmp_path):
    """Train on two ranks, save on rank 0, destroy_process_group(): two runs at once (six
    interpreters ending beside one another), not one abort ("terminate called without an
    active exception"). The cause, gloo's threads alive in finalisation, is checked directly
    above; these runs watch for any other way out."""
    from concurrent.futures import ThreadPoolExecutor

    def one_run(index):
        result = torchrun("tests/programs/gpt_ddp.py", "--steps", "2",
                          "--out", str(tmp_path / f"gpt{index}.pt"), timeout=240)
        return index, result.returncode, result.stderr

    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = list(pool.map(one_run, range(2)))
    failed = [(index, code, stderr[-1500:]) for index, code, stderr in runs
              if code != 0 or "terminate called" in stderr]
    assert not failed, failed[0]


def test_eager_init_with_a_cuda_device_id_and_device_generic_helpers():
    result = torchrun("tests/programs/eager_init.py", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        assert f"rank {rank}: bound nccl, torch.cpu, True, torch.bfloat16" in result.stdout


def test_collectives_written_for_nccl_complete_in_the_order_they_were_issued(tmp_path):
    """NCCL finishes a group's collectives in issue order, and DeepSpeed's ZeRO-3 waits on
    the last of its gathers only; gloo's threads finish them in any order. No buffer is read
    before its gather has filled it, whichever way the program learns that the last is done."""
    result = torchrun("tests/programs/collective_order.py", "--out", str(tmp_path / "order"))
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in (0, 1):
        unfilled = json.loads((tmp_path / f"order.rank{rank}.json").read_text())
        assert set(unfilled) == {"wait_on_last", "blocking_after", "is_completed", "future", "subgroup"}
        assert not any(unfilled.values()), (rank, unfilled)


def test_sync_batch_norm_under_ddp_normalizes_with_the_whole_batch_on_the_host(tmp_path):
    """A --sync-bn trainer on the CPU target: DDP and SyncBatchNorm take host modules as
    they take CUDA ones, and SyncBatchNorm's CUDA-only statistics ops are cudashim's
    portable kernels. Each rank's share normalizes, back-propagates and updates running
    statistics as plain BatchNorm over the whole batch does."""
    result = torchrun("tests/programs/sync_batchnorm.py", str(tmp_path / "sbn"))
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"sbn.rank{rank}.json").read_text())
        assert seen["device"] == "cpu"
        assert all(worst < 1e-5 for worst in seen["worst"].values()), seen


def test_fsdp_full_state_dicts_offloaded_to_the_cpu_are_whole(tmp_path):
    """FSDP offloads with .cpu(), which copies a CUDA tensor and returns a host tensor itself;
    on the host it then freed what the state dict pointed into. The offloaded full state
    dict (Lightning's strategy="fsdp" checkpoints) is whole and equals the module's weights."""
    result = torchrun("tests/programs/fsdp_state_dict.py", str(tmp_path / "state.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((tmp_path / "state.json").read_text()) == {"names": True, "equal": True}
