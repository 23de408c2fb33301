"""``cudashim scan`` on code written the way CUDA programs are written, and the run-time
refusal of CUDA C++ extension builds that the scan predicts."""

import json
import re
import textwrap
from pathlib import Path

import pytest

from conftest import ROOT, python

TREE = ROOT / "tests" / "scan_tree"
MARK = re.compile(r"#\s*scan:\s*(.+?)\s*$")


def _scan(paths, backend="cpu", cwd=TREE, monkeypatch=None):
    from cudashim.scan import scan
    monkeypatch.chdir(cwd)
    return scan(paths, backend=backend)


def _marks(folder: Path):
    """{(file, line, class)} for every "# scan: <class>" comment under ``folder``."""
    marks = set()
    for path in folder.rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            found = MARK.search(line)
            if found:
                marks.add((str(path.relative_to(folder)), number, found.group(1)))
    return marks


def _by_line(result):
    return {(f.path, f.line, f.kind) for f in result.findings}


def test_every_finding_in_the_tree_is_expected_and_every_expected_one_is_found(monkeypatch):
    result = _scan(["."], monkeypatch=monkeypatch)
    assert not result.errors
    assert _by_line(result) == _marks(TREE)
    assert "data.py" in result.files                        # read, and nothing found in it
    assert not [f for f in result.findings if f.path == "data.py"]
    assert result.exit_status == 1


def test_fixes_name_the_concrete_replacement(monkeypatch):
    result = _scan(["."], monkeypatch=monkeypatch)
    fixes = {(f.path, f.line): f.fix for f in result.findings
             if f.kind in ("needs a change", "runs differently")}
    assert fixes[("train.py", 22)] == "x.is_cuda"
    # th is torch here: the fix is written with the file's own alias
    assert fixes[("telemetry.py", 19)] == "name.startswith(th.device('cuda').type)"
    assert fixes[("telemetry.py", 22)] == "kind == th.device('cuda').type"
    assert fixes[("telemetry.py", 8)] == "th.device('cuda').type in str(device)"
    pool = fixes[("ddp_setup.py", 34)]
    from cudashim.tables.cuda_surface import SURFACE
    assert pool == SURFACE["torch.cuda"]["MemPool"][1]       # the runtime's own way out


def test_what_a_finding_becomes_is_named_for_the_target(monkeypatch):
    import cudashim.backends as backends

    cpu = {(f.path, f.line): f.what for f in _scan(["."], monkeypatch=monkeypatch).findings}
    assert cpu[("inference.py", 10)] == ("the device 'cuda:0' becomes 'cpu' (host memory, the CPU "
                                         "backend's virtual device 0)")
    assert cpu[("ddp_setup.py", 13)] == "the process-group backend 'nccl' becomes 'gloo'"
    from cudashim.scan.target import Target
    assert Target.named("cpu", device_count=2).device("cuda:1", 1) == (
        "handled", "the device 'cuda:1' becomes 'cpu' (host memory, the CPU backend's virtual "
        "device 1)", None)
    kind, what, fix = Target.named("cpu", device_count=1).device("cuda:1", 1)
    assert (kind, fix) == ("needs a change", "run with --device-count 2 (CUDASHIM_DEVICE_COUNT), "
                                             "and scan with the same option")
    assert what.startswith("the device 'cuda:1' does not exist in the run: it sees 1 CUDA device")
    assert cpu[("ddp_setup.py", 18)].startswith("a TF32 flag: it turns the target's reduced-precision")
    assert cpu[("train.py", 15)] == "a CUDA library flag: setting it is harmless where it does not apply"
    xpu = _scan(["."], backend="xpu", monkeypatch=monkeypatch)
    found = {(f.path, f.line): f for f in xpu.findings}
    assert found[("inference.py", 10)].what == "the device 'cuda:0' becomes 'xpu:0'"
    assert found[("ddp_setup.py", 15)].what == "the device 'cuda:{local_rank}' becomes 'xpu:{local_rank}'"
    collective = backends.backend_class("xpu").default_collective
    assert found[("ddp_setup.py", 13)].what == f"the process-group backend 'nccl' becomes '{collective}'"
    # triton compiles for XPU: the kernel is handled there, and blocks on the CPU
    assert found[("kernels/fused.py", 10)].kind == "handled"
    assert "native triton" in found[("kernels/fused.py", 10)].what


def test_on_real_cuda_everything_is_native(monkeypatch):
    result = _scan(["."], backend="cuda", monkeypatch=monkeypatch)
    assert result.findings and {f.kind for f in result.findings} == {"handled"}
    assert result.exit_status == 0


def test_torch_cuda_names_are_classified_by_the_proxy_surface(tmp_path, monkeypatch):
    import torch.cuda

    from cudashim.proxy.surface import classify
    from cudashim.tables import cuda_surface

    names = cuda_surface.public_names(torch.cuda)
    (tmp_path / "uses.py").write_text(
        "import torch\n" + "".join(f"x = torch.cuda.{name}\n" for name in names))
    result = _scan(["uses.py"], cwd=tmp_path, monkeypatch=monkeypatch)
    kinds = {f.line - 2: f.kind for f in result.findings}
    assert len(kinds) == len(names)
    for number, name in enumerate(names):
        value = getattr(torch.cuda, name)
        kind = (cuda_surface.SUBMODULE, None) if isinstance(value, type(torch)) else \
            classify(torch.cuda, torch.cuda, name)
        expected = "needs a change" if kind[0] == cuda_surface.REFUSED else "handled"
        assert kinds[number] == expected, name


def test_aliases_and_devices_assigned_in_the_same_function(tmp_path, monkeypatch):
    (tmp_path / "aliased.py").write_text(textwrap.dedent("""\
        import torch as th
        from torch import cuda
        from torch.cuda import empty_cache as free


        def step(batch):
            dev = th.device("cuda")
            if dev.type == "cuda":
                cuda.synchronize()
            free()
            label = str(batch.device).split(":")[0]
            return label != "cuda"


        def unrelated(dev):
            label = "cuda"
            return label == "cuda" and dev == 1


        def config(args):
            device = "cuda"
            return "cuda" in device


        def named(dev):
            return f"{dev}" == "cuda:0"
        """))
    result = _scan(["aliased.py"], cwd=tmp_path, monkeypatch=monkeypatch)
    found = {(f.line, f.kind) for f in result.findings}
    assert found == {(3, "handled"),           # from torch.cuda import empty_cache as free
                     (7, "handled"),           # th.device("cuda")
                     (8, "runs differently"),  # dev.type == "cuda": the synchronize is skipped
                     (9, "handled"),           # cuda.synchronize()
                     (12, "runs differently"), # label != "cuda", label made from a device
                     (16, "handled"),          # "cuda", a spec the program holds
                     (21, "handled"),          # the same: comparing its own strings is fine
                     (26, "runs differently")} # an f-string of a device
    fixes = {f.line: f.fix for f in result.findings if f.kind == "runs differently"}
    assert fixes[8] == "dev.type == th.device('cuda').type"
    assert fixes[12] == "not batch.is_cuda"             # label came from batch.device
    assert fixes[26] == "f'{dev}' == str(th.device('cuda:0'))"


def test_a_move_by_a_tensors_device_written_in_place_is_named_where_host_memory_is_the_devices(
        tmp_path, monkeypatch):
    (tmp_path / "masks.py").write_text(textwrap.dedent("""\
        import torch


        def apply(model, mask, scores, logits):
            mask = mask.to(logits.device)
            mask.masked_fill_(scores < 0, 0)
            bias = scores.to(device=logits.device)
            total = scores.to(logits.device, non_blocking=True)
            total[0] = 0
            kept = scores.to(logits.device)
            named = scores.to("cuda")
            named.add_(1)
            on_weights = scores.to(model.weight.device)
            on_weights.add_(1)
            on_parameters = scores.to(next(model.parameters()).device)
            on_parameters.add_(1)
            on_the_model = scores.to(model.device)
            on_the_model.add_(1)
            on_an_output = scores.to(model_output.device)
            on_an_output.add_(1)
            return scores.to(logits.device).mul_(2), bias.sum(), kept + named, total
        """))
    cpu = _scan(["masks.py"], cwd=tmp_path, monkeypatch=monkeypatch)
    moves = {f.line for f in cpu.findings if f.rule == "CS204"}
    # written in place: by a method, by an item, in one chain, and off an output named like a
    # model's; read only (bias, kept), moved by name, or to a parameter's or a model's device
    # (whose side the CPU backend knows): no finding
    assert moves == {5, 8, 19, 21}
    assert all(f.kind == "runs differently" for f in cpu.findings if f.rule == "CS204")
    xpu = _scan(["masks.py"], backend="xpu", cwd=tmp_path, monkeypatch=monkeypatch)
    assert not [f for f in xpu.findings if f.rule == "CS204"]   # device memory of its own: a copy


# A program whose moves are by a device's string (`# string`), or by a device read off an op's
# result (`# result`), or by what the runtime knows: each case records whether CUDA's copy was made.
_MOVES_PROGRAM = textwrap.dedent("""\
    import json, sys
    import torch

    model = torch.nn.Linear(4, 4).cuda()
    copied = {}


    class Prefetcher:
        def __init__(self, model):
            self.device = str(next(model.parameters()).device)
            self.staging = torch.zeros(2, 4).pin_memory()

        def preload(self, value):
            self.staging.fill_(value)
            self.batch = self.staging.to(self.device, non_blocking=True)  # string


    class KnownDevice:
        def __init__(self):
            self.device = torch.device("cuda")
            self.staging = torch.zeros(2, 4).pin_memory()

        def preload(self, value):
            self.staging.fill_(value)
            self.batch = self.staging.to(self.device, non_blocking=True)


    for name, prefetcher in (("prefetcher", Prefetcher(model)), ("known device", KnownDevice())):
        prefetcher.preload(1)
        first = prefetcher.batch
        prefetcher.preload(2)
        copied[name] = first[0, 0].item() == 1
    logits = model(torch.ones(2, 4, device="cuda"))
    staging = torch.ones(2, 4)
    for turn in range(2):
        batch = staging.to(logits.device)  # result
        staging.fill_(turn + 5)
    copied["staging refilled"] = batch[0, 0].item() == 5
    snapshot = torch.nn.Linear(4, 4).to(f"{logits.device}")  # string
    best = snapshot.weight.cpu()
    with torch.no_grad():
        snapshot.weight.fill_(3)
    copied["best weights"] = best[0, 0].item() != 3
    unplaced = torch.ones(2, 4) * 2
    moved = unplaced.to(str(torch.device("cuda")))  # string
    copied["moved back"] = moved.cpu() is not moved
    again = torch.device(str(model.weight.device))
    kept = torch.ones(2, 4).cpu()
    copied["device made again"] = kept.to(again) is not kept  # string
    read_off_a_parameter = torch.ones(2, 4).to(model.weight.device)
    read_off_a_parameter.add_(1)
    host = torch.device("cpu")
    on_the_host = torch.ones(2, 4).to(str(host))
    by_name = torch.ones(2, 4).pin_memory()
    moved = by_name.to("cuda")
    by_name.fill_(7)
    copied["by name"] = moved[0, 0].item() == 1
    json.dump(copied, open(sys.argv[1], "w"))
    """)


def test_moves_by_a_devices_string_and_writes_into_the_tensor_moved_are_named_as_the_run_behaves(
        tmp_path, monkeypatch):
    """On the CPU backend every device's string is 'cpu', the host's name, so a move by one
    (``x.to(str(d))``, ``model.to(f"{d}")``, ``x.to(torch.device(str(d)))``) lands in host memory:
    the scan names each (CS205). A
    move by a device read off an op's result keeps torch's answer, and the scan now names it where
    the program writes into the tensor it moved, a staging buffer refilled at the next turn (CS204),
    as well as into the result. The run shows CUDA's copy missing at exactly those moves on the CPU
    backend, and made at every move on a target with memory of its own."""
    from targets import targets

    (tmp_path / "moves.py").write_text(_MOVES_PROGRAM)
    lines = _MOVES_PROGRAM.splitlines()
    marked = {rule: {number for number, line in enumerate(lines, 1) if line.endswith(f"# {mark}")}
              for rule, mark in (("CS205", "string"), ("CS204", "result"))}
    cpu = _scan(["moves.py"], cwd=tmp_path, monkeypatch=monkeypatch)
    for rule, expected in marked.items():
        assert {f.line for f in cpu.findings if f.rule == rule} == expected, rule
    assert all(f.kind == "runs differently" for f in cpu.findings if f.rule in marked)
    xpu = _scan(["moves.py"], backend="xpu", cwd=tmp_path, monkeypatch=monkeypatch)
    assert not [f for f in xpu.findings if f.rule in marked]       # memory of its own: copies

    def run(*options):
        out = tmp_path / "copied.json"
        result = python("-m", "cudashim", *options, "moves.py", str(out), cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(out.read_text())

    assert {case for case, made in run().items() if not made} == \
        {"prefetcher", "staging refilled", "best weights", "moved back", "device made again"}
    for target in targets():
        seen = run(*target.options)
        assert all(seen.values()), (target.name, seen)


def test_follows_the_programs_own_imports_and_nothing_installed(monkeypatch):
    result = _scan(["train.py"], monkeypatch=monkeypatch)
    assert result.files == ["train.py", "data.py", "telemetry.py"]
    result = _scan(["inference.py"], monkeypatch=monkeypatch)
    assert result.files == ["inference.py", "kernels/fused.py"]


def _cudashim_scan(*args, cwd):
    """The ``cudashim scan`` console command, in a fresh interpreter."""
    return python("-c", "from cudashim.cli import main; main()", "scan", *args, cwd=cwd)


def test_command_line_summary_json_and_exit_status(tmp_path):
    (tmp_path / "clean.py").write_text("import torch\nprint(torch.ones(2).sum())\n")
    (tmp_path / "broken.py").write_text("import torch\ndef broken(:\n")

    blocked = _cudashim_scan("--backend", "cpu", str(TREE), cwd=TREE)
    assert blocked.returncode == 1, blocked.stderr
    lines = blocked.stdout.splitlines()
    assert lines[0].startswith("cudashim scan: 9 files for the 'cpu' backend")
    needs_a_change = sum(1 for mark in _marks(TREE) if mark[2] == "needs a change")
    assert lines[2].split() == ["needs", "a", "change", str(needs_a_change)]
    assert "files with blockers:" in blocked.stdout
    assert blocked.stdout.index("files with blockers:") < blocked.stdout.index("needs a change:")

    clean = _cudashim_scan("--json", "clean.py", cwd=tmp_path)
    assert clean.returncode == 0, clean.stderr
    assert json.loads(clean.stdout)["summary"] == {"needs a change": 0, "cannot run here": 0,
                                                   "runs differently": 0, "handled": 0}

    bad = _cudashim_scan("--json", ".", "missing.py", cwd=tmp_path)
    assert bad.returncode == 2
    report = json.loads(bad.stdout)
    assert report["errors"] == ["missing.py: no such file or directory",
                                "broken.py:2: cannot parse: invalid syntax"]
    assert report["files_scanned"] == 2                     # the scan went on

    unknown = _cudashim_scan("--backend", "tpu", ".", cwd=tmp_path)
    assert unknown.returncode == 2 and "unknown cudashim backend 'tpu'" in unknown.stderr


@pytest.mark.parametrize("builder, arguments, expected", [
    ("CUDAExtension", {"name": "x", "sources": ["a.cpp", "k.cu"]}, ["a.cpp", "k.cu"]),
    ("load", {"name": "x", "sources": ["a.cpp", "k.cu"]}, ["k.cu"]),
    ("load", {"name": "x", "sources": ["a.cpp"]}, None),
    ("load", {"name": "x", "sources": ["a.cpp"], "with_cuda": True}, ["with_cuda=True"]),
    ("load", {"name": "x", "sources": ...}, None),                # unknown: names nothing
    ("load_inline", {"name": "x", "cpp_sources": "", "cuda_sources": "k"}, ["inline CUDA sources"]),
    ("load_inline", {"name": "x", "cpp_sources": "int f();"}, None),
])
def test_which_extension_builds_compile_cuda(builder, arguments, expected):
    from cudashim.patches.extensions import cuda_sources
    assert cuda_sources(builder, arguments) == expected


def test_building_a_cuda_extension_under_the_shim_names_the_sources_and_the_way_out(shim):
    import torch.utils.cpp_extension as cpp_extension

    from cudashim.errors import UnsupportedCudaAPI

    refusing = cpp_extension.load
    with pytest.raises(UnsupportedCudaAPI, match=r"load is not supported .*\(k\.cu\); .*CppExtension"):
        cpp_extension.load("ops", sources=["ops.cpp", "k.cu"])
    with pytest.raises(UnsupportedCudaAPI, match="inline CUDA sources"):
        cpp_extension.load_inline("ops", cpp_sources="", cuda_sources="__global__ void f() {}")
    with pytest.raises(UnsupportedCudaAPI, match=r"\(ops\.cpp, k\.cu\)"):
        cpp_extension.CUDAExtension("ops", ["ops.cpp", "k.cu"])
    shim.deactivate()
    assert cpp_extension.load is refusing.__wrapped__
    with pytest.raises(OSError, match="CUDA_HOME"):            # torch's own error again
        cpp_extension.CUDAExtension("ops", ["ops.cpp", "k.cu"])


def test_a_setup_py_building_a_cuda_extension_fails_with_the_way_out(tmp_path):
    result = python("-m", "cudashim", "--backend", "cpu", str(TREE / "ext" / "setup.py"),
                    "build_ext", cwd=tmp_path)
    assert result.returncode != 0
    assert "UnsupportedCudaAPI: torch.utils.cpp_extension.CUDAExtension" in result.stderr
    assert "fused_ops_kernel.cu" in result.stderr and "CppExtension" in result.stderr
    assert "CUDA_HOME" not in result.stderr


def test_nccl_variables_a_job_sets_are_read_from_the_runtimes_table(tmp_path, monkeypatch):
    (tmp_path / "job.py").write_text(
        'import os\nos.environ["NCCL_SOCKET_IFNAME"] = "eth0"\nos.environ.setdefault("NCCL_IB_DISABLE", "1")\n'
        'print("set NCCL_DEBUG=INFO to debug")\n')
    found = {f.line: f for f in _scan(["job.py"], cwd=tmp_path, monkeypatch=monkeypatch).findings}
    assert sorted(found) == [2, 3]                       # a sentence that names one is not code
    assert found[2].what == "NCCL_SOCKET_IFNAME: becomes GLOO_SOCKET_IFNAME for gloo, unless that is set"
    assert found[3].what.startswith("NCCL_IB_DISABLE: no effect on gloo")
    npu = {f.line: f for f in _scan(["job.py"], backend="npu", cwd=tmp_path, monkeypatch=monkeypatch).findings}
    assert npu[2].what.endswith("; becomes HCCL_SOCKET_IFNAME for hccl, unless that is set")


def test_scan_says_what_each_frameworks_device_layer_gets(tmp_path, monkeypatch):
    """Lightning and Accelerate keep their CUDA paths, DeepSpeed takes its accelerator for the
    target, Ray counts CUDA devices for use_gpu; a Trainer told to use the CPU and Ray's
    default choose nothing CUDA, and DeepSpeed on a target it has no accelerator for needs a
    change."""
    (tmp_path / "train.py").write_text(textwrap.dedent('''\
        import deepspeed
        import lightning as L
        from accelerate import Accelerator
        from lightning.pytorch import Trainer
        trainer = L.Trainer(accelerator="gpu", devices=2, precision="16-mixed")
        fabric = L.Fabric(accelerator="cuda")
        cpu_trainer = Trainer(accelerator="cpu")
        auto_trainer = Trainer(devices=1)
        accelerator = Accelerator(mixed_precision="fp16")
        engine, *_ = deepspeed.initialize(model=None, config={})
        from ray.train import ScalingConfig
        gpus = ScalingConfig(num_workers=2, use_gpu=True)
        cpus = ScalingConfig(num_workers=2)
        '''))

    def findings(backend):
        """{line: the framework finding on it}: the line's other findings (the "cuda" string
        that becomes the target's device) are the device rules'."""
        result = _scan(["train.py"], backend=backend, cwd=tmp_path, monkeypatch=monkeypatch)
        return {f.line: (f.kind, f.what) for f in result.findings
                if f.what.startswith(("Lightning", "Accelerate", "DeepSpeed", "Ray", "native"))}

    cpu = findings("cpu")
    assert 7 not in cpu
    assert cpu[5] == ("handled", "Lightning's CUDA accelerator (accelerator='gpu'): it holds CUDA devices, "
                                 "and what it moves to them is placed on the cpu device")
    assert cpu[6][1].startswith("Lightning's CUDA accelerator (accelerator='cuda')")
    assert cpu[8][1].startswith("Lightning's CUDA accelerator (accelerator='auto')")
    assert cpu[9][1].startswith("Accelerate's CUDA path")
    assert cpu[10] == ("handled", "DeepSpeed's own 'cpu' accelerator (DS_ACCELERATOR), with its ops and "
                                  "collectives for the target")
    assert cpu[12] == ("handled", "Ray counts the CUDA devices the program sees, so use_gpu=True schedules its "
                                  "workers on them; the workers it starts are under cudashim, on the cpu device")
    assert 13 not in cpu                                # Ray's default: CPU workers
    assert findings("npu")[9] == ("handled", "Accelerate's own npu path, which it checks before CUDA")
    assert findings("accelerator")[10][0] == "needs a change"
    assert findings("cuda")[5] == ("handled", "native CUDA")


def test_doctor_says_the_same_of_each_framework():
    import types
    from cudashim.doctor import framework_lines
    cpu = types.SimpleNamespace(redirects=True, device_type="cpu", deepspeed_accelerator="cpu")
    lines = {line.split()[0]: line for line in framework_lines(cpu)}
    assert set(lines) == {"Lightning", "Accelerate", "DeepSpeed", "Ray"}
    assert "use_gpu=True schedules its workers on them" in lines["Ray"]
    assert "DeepSpeed's own 'cpu' accelerator (DS_ACCELERATOR)" in lines["DeepSpeed"]
    vulkan = types.SimpleNamespace(redirects=True, device_type="vulkan", deepspeed_accelerator=None)
    assert next(framework_lines(vulkan)).startswith("Lightning")
    assert list(framework_lines(vulkan))[2].endswith("(needs a change)")
    cuda = types.SimpleNamespace(redirects=False, device_type="cuda", deepspeed_accelerator=None)
    assert all(line.endswith(": native CUDA") for line in framework_lines(cuda))


def test_prose_is_never_code_and_does_not_block(tmp_path):
    # What a new user writes first: setup prints, a help text, a caught nvidia-smi.
    (tmp_path / "check.py").write_text(textwrap.dedent("""\
        import argparse, logging, subprocess, warnings
        import torch

        parser = argparse.ArgumentParser(description="needs cuda:0 and nccl")
        parser.add_argument("--sync", help="call torch.cuda.synchronize() each step")
        print("torch.cuda.is_available():", torch.cuda.is_available())
        logging.info("using %s on cuda:1 with nvidia-smi", "nccl")
        warnings.warn("torch.cuda.amp.autocast is deprecated on cuda")
        assert torch.ones(1).sum() == 1, "cuda:0 broke"
        try:
            subprocess.run(["nvidia-smi"], check=True)
        except FileNotFoundError as e:
            print("nvidia-smi missing:", e)
        """))
    result = _cudashim_scan("--json", "--backend", "cpu", "check.py", cwd=tmp_path)
    report = json.loads(result.stdout)
    assert result.returncode == 0, report["findings"]
    found = {(f["line"], f["kind"], f["rule"]) for f in report["findings"]}
    assert found == {(6, "handled", "CS101"),            # the call printed, not the label
                     (11, "runs differently", "CS203")}  # nvidia-smi, caught


def test_a_device_name_test_blocks_only_where_the_path_taken_stops(monkeypatch):
    found = {(f.path, f.line): f for f in _scan(["."], monkeypatch=monkeypatch).findings}
    skipped = found[("telemetry.py", 8)]
    assert skipped.kind == "runs differently"
    assert skipped.what.endswith("the test is False on the target: lines 9-10 "
                                 "(memory_allocated, print) are skipped")
    raising = found[("judged.py", 31)]
    assert raising.kind == "needs a change" and raising.fix == "not x.is_cuda"
    assert raising.what.endswith("the test is True on the target, and the branch taken raises")
    assert found[("judged.py", 34)].what.endswith("the branch taken exits (sys.exit('run on cuda:0'))")
    assert found[("judged.py", 33)].what.endswith("the assertion fails on the target")


def test_device_indices_are_judged_for_the_devices_the_run_has(monkeypatch):
    one = {(f.path, f.line): f for f in _scan(["judged.py"], monkeypatch=monkeypatch).findings}
    assert one[("judged.py", 44)].kind == "needs a change"
    from cudashim.scan import scan
    two = {(f.path, f.line): f for f in scan(["judged.py"], backend="cpu", device_count=2).findings}
    assert two[("judged.py", 44)].kind == "handled"
    assert two[("judged.py", 44)].what == "runs over the target's devices [0, 1]"
    monkeypatch.setenv("CUDASHIM_DEVICE_COUNT", "2")          # the run's own variable counts too
    again = {(f.path, f.line): f.kind for f in scan(["judged.py"], backend="cpu").findings}
    assert again[("judged.py", 44)] == "handled"


def test_sarif_explain_and_json_carry_the_rules(tmp_path):
    from cudashim.scan import catalog

    sarif = _cudashim_scan("--format", "sarif", "--backend", "cpu", ".", cwd=TREE)
    assert sarif.returncode == 1                             # the same exit status as text
    log = json.loads(sarif.stdout)
    assert log["version"] == "2.1.0"
    run = log["runs"][0]
    rules = [rule["id"] for rule in run["tool"]["driver"]["rules"]]
    blockers = sum(1 for mark in _marks(TREE) if mark[2] in ("needs a change", "cannot run here"))
    assert sum(1 for r in run["results"] if r["level"] == "error") == blockers
    for result in run["results"]:
        assert rules[result["ruleIndex"]] == result["ruleId"] and result["ruleId"] in catalog.RULES
        location = result["locations"][0]["physicalLocation"]
        assert (TREE / location["artifactLocation"]["uri"]).is_file()
        assert location["region"]["startLine"] >= 1

    elsewhere = json.loads(_cudashim_scan("--format", "sarif", "--backend", "cpu",
                                          str(TREE / "judged.py"), cwd=tmp_path).stdout)
    uris = {r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
            for r in elsewhere["runs"][0]["results"]}
    assert uris == {(TREE / "judged.py").as_uri()}         # outside the folder: a file URI

    explained = _cudashim_scan("--explain", "device-name-compare", cwd=tmp_path)
    assert explained.returncode == 0
    assert explained.stdout.startswith("CS201 (device-name-compare)")
    assert _cudashim_scan("--explain", "cs201", cwd=tmp_path).stdout == explained.stdout
    unknown = _cudashim_scan("--explain", "CS999", cwd=tmp_path)
    assert unknown.returncode == 2 and "no scan rule 'CS999'" in unknown.stderr

    report = json.loads(_cudashim_scan("--json", "--backend", "cpu", ".", cwd=TREE).stdout)
    assert report["format"] == 2 and report["device_count"] == 1
    assert {f["rule"] for f in report["findings"]} <= set(catalog.RULES)


def test_a_gap_in_one_kind_of_call_is_reported_for_those_calls_only(tmp_path, monkeypatch):
    """F.interpolate's CUDA kernels resize float16 and bfloat16 images with antialiasing, which the
    CPU's refuse: a call passing antialias true (or a value the scan cannot read) is a kernel-gap
    finding; one resizing without it, which the CPU computes, is not."""
    from cudashim.scan import catalog
    lines = ["import torch", "import torch.nn.functional as F",
             "a = F.interpolate(x, size=(4, 4), mode='bilinear', antialias=True)",
             "b = F.interpolate(x, scale_factor=2.0, mode='bilinear')",
             "c = F.interpolate(x, size=(4, 4), mode='bicubic', antialias=smooth)",
             "d = torch.nn.functional.interpolate(x, size=(4, 4), antialias=False)"]
    (tmp_path / "resize.py").write_text("\n".join(lines) + "\n")
    gaps = {f.line for f in _scan(["resize.py"], cwd=tmp_path, monkeypatch=monkeypatch).findings
            if f.rule == catalog.BY_NAME["kernel-gap"].id}
    assert gaps == {3, 5}


def test_every_runtime_table_entry_reaches_a_scan_rule(tmp_path, monkeypatch):
    """A runtime decision the scan does not know fails here: each entry of the runtime's tables,
    written as a program would use it, gives a finding of the rule that reads that table."""
    from cudashim.patches import _nccl_environment, frameworks
    from cudashim.scan import catalog
    from cudashim.tables import device_parameters, dtype_gaps, dtype_gaps_by_release, libraries

    uses = []                                  # (source line, the rule it must reach)
    uses += [(f"torch.{name}(x{', ' + dtype_gaps.ONLY_WITH[name] + '=True' if name in dtype_gaps.ONLY_WITH else ''})",
              "kernel-gap") for name in dtype_gaps.GAPS]
    uses += [(f"torch.{name}(x)", "kernel-gap")
             for table in dtype_gaps_by_release.BEYOND.values() for name in table]
    uses += [(f"{key.partition('(')[0].replace(':', '.')}()", "private-entry-point")
             for key in device_parameters.PRIVATE_ENTRY_POINTS if not key.startswith("torch.cuda:")]
    uses += [(f"torch.cuda.{key.partition(':')[2].partition('(')[0]}", "private-entry-point")
             for key in device_parameters.PRIVATE_ENTRY_POINTS if key.startswith("torch.cuda:")]
    told = {"Lightning": "accelerator='gpu'", "Ray": "use_gpu=True"}   # as GPU programs say it
    uses += [(f"{name}({told.get(framework, '')})", "framework-accelerator")
             for name, framework in frameworks.ENTRY_POINTS.items()]
    uses += [(f"os.environ[{name!r}]", "nccl-environment")
             for entry in _nccl_environment.TABLE for name in entry.names]
    from cudashim import substitutes
    uses += [(f"import {name}", "substituted-library"
              if substitutes.library_of(name) is not None and substitutes.provides(name)
              else "cuda-only-library")
             for name, library in libraries.LIBRARIES.items()
             if library.way_out or library.stand_in]
    uses += [(f"torch.cuda.{name}", "cuda-graphs") for name in
             ("CUDAGraph", "graph", "graph_pool_handle", "make_graphed_callables",
              "is_current_stream_capturing")]
    uses += sorted({(f"torch.nn.parallel.{key.partition(':')[2].split('.')[0].partition('(')[0]}"
                     f"(m, {key.partition('(')[2].rstrip(')')}=[0])", "data-parallel")
                    for key in device_parameters.DELEGATED_TO
                    if key.startswith("torch.nn.parallel:") and key.endswith(("_ids)", "devices)"))})
    from cudashim.patches import version_gates
    uses += [(f"{gate.api_name}()", "version-answer") for gate in version_gates.BY_CALLER]
    from cudashim.tables import meshes
    uses += [(f"{name}('cuda')", "device-mesh") for name in meshes.CALLS]
    imports = sorted({use.split(".")[0] for use, _ in uses if not use.startswith(("import", "os"))})
    header = ["import os", *(f"import {name.rstrip('()')}" for name in imports)]
    (tmp_path / "uses.py").write_text("\n".join(header + [use for use, _ in uses]) + "\n")
    result = _scan(["uses.py"], cwd=tmp_path, monkeypatch=monkeypatch)
    by_line = {}
    for finding in result.findings:
        by_line.setdefault(finding.line, set()).add(finding.rule)
    for number, (use, rule) in enumerate(uses, len(header) + 1):
        assert catalog.BY_NAME[rule].id in by_line.get(number, set()), (use, by_line.get(number))
    # and no rule of the catalog is dead: each is reached here or in the tree
    reached = {f.rule for f in result.findings} | \
        {f.rule for f in _scan(["."], monkeypatch=monkeypatch).findings}
    assert reached == set(catalog.RULES)

