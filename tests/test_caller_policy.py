"""One caller policy: torch and the libraries that load CUDA code hear the truth; the
program and every other library hear the compatible answer, through torch.cuda,
torch.version, torch.backends.cuda and torch.accelerator alike."""

import sys
import textwrap

import pytest
import torch

from conftest import python

PROBE = textwrap.dedent("""
    import torch

    def probe():
        acc = torch.accelerator.current_accelerator()
        return {"is_available": torch.cuda.is_available(), "version": torch.version.cuda,
                "is_built": torch.backends.cuda.is_built(),
                "cudnn": torch.backends.cudnn.version(),
                "accelerator": None if acc is None else acc.type,
                "is_cuda": torch.zeros(1, device="cuda").is_cuda}
""")
TRUTH = {"is_available": False, "version": None, "is_built": False, "cudnn": None,
         "accelerator": None, "is_cuda": False}
COMPATIBLE = {"is_available": True, "version": "12.8", "is_built": True, "cudnn": 91002,
              "accelerator": "cpu", "is_cuda": True}


@pytest.fixture
def libraries(tmp_path):
    """Two importable libraries asking the same questions: bitsandbytes (honest by default)
    and mylib (not)."""
    for name in ("bitsandbytes", "mylib"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(PROBE)
    sys.path.insert(0, str(tmp_path))
    return tmp_path


def test_libraries_that_load_cuda_code_hear_the_truth_and_others_the_compatible_answer(libraries):
    import cudashim
    cudashim.activate("cpu")
    try:
        import bitsandbytes
        import mylib
        assert bitsandbytes.probe() == TRUTH
        assert mylib.probe() == COMPATIBLE
    finally:
        cudashim.deactivate()
    # Deactivated: everyone hears the truth.
    assert (mylib.torch.cuda.is_available(), mylib.torch.version.cuda) == (False, None)
    assert mylib.torch.backends.cudnn.version() is None


def test_honest_for_adds_modules_and_takes_default_ones_out(libraries):
    import cudashim
    cudashim.activate("cpu", honest_for="mylib,-bitsandbytes", cuda_version="11.8")
    try:
        import bitsandbytes
        import mylib
        assert mylib.probe() == TRUTH
        # the cuDNN torch's wheels for that CUDA line ship
        assert bitsandbytes.probe() == {**COMPATIBLE, "version": "11.8", "cudnn": 90100}
    finally:
        cudashim.deactivate()


def test_torch_modules_that_are_cuda_programs_hear_what_the_program_hears():
    """FSDP2 before torch 2.6 takes torch.cuda's streams for the program's devices: told the
    truth on a machine without CUDA, it initialized CUDA and died ("Found no NVIDIA driver")."""
    from cudashim.callers import CallerPolicy

    policy = CallerPolicy(honest_for=["torch.distributed._composable"])
    assert not policy.is_honest_module("torch.distributed._composable.fsdp._fsdp_state")
    assert not policy.is_honest_module("torch.distributed._composable.fsdp")
    assert policy.is_honest_module("torch.distributed._composable.replicate")
    assert policy.is_honest_module("torch.distributed.fsdp._fully_shard._fsdp_state")
    assert not policy.is_honest_module("torch_fsdp_extras")


def test_feature_gates_of_the_program_pass(shim):
    # The Hugging Face Trainer's TF32 gate (transformers' is_torch_tf32_available), as written.
    def is_torch_tf32_available():
        if not torch.cuda.is_available() or torch.version.cuda is None:
            return False
        if torch.cuda.get_device_properties(torch.cuda.current_device()).major < 8:
            return False
        return True

    assert is_torch_tf32_available()
    assert torch.backends.cuda.is_built()
    assert torch.backends.cudnn.is_available() and torch.backends.cudnn.version() >= 8000
    from torch.version import cuda
    assert cuda == "12.8" and torch.version.__version__ == shim.get_original(torch, "version").__version__


def test_torch_accelerator_shows_the_machine_torch_cuda_shows(shim):
    acc = torch.accelerator.current_accelerator()
    assert acc == torch.device("cuda")                      # both the target device
    assert torch.accelerator.is_available() and torch.accelerator.device_count() == torch.cuda.device_count()
    assert torch.accelerator.current_device_index() == torch.cuda.current_device()
    torch.accelerator.synchronize()                         # naming no device: the current one
    on_device = torch.ones(256, device="cuda")
    assert torch.accelerator.memory_allocated() == torch.cuda.memory_allocated() >= on_device.nbytes
    module = torch.get_device_module(acc)
    assert module.is_bf16_supported() in (True, False)
    # torch's own helpers still hear the truth (no accelerator) and take their CPU paths.
    with torch.random.fork_rng():
        torch.randn(2)
    from torch.utils.checkpoint import DefaultDeviceType
    assert DefaultDeviceType.get_device_type() == "cpu"


def test_deactivation_restores_every_gate():
    import cudashim
    from cudashim import activation
    version, is_built = torch.version, torch.backends.cuda.is_built
    current = torch.accelerator.current_accelerator
    cudashim.activate("cpu", honest_for="mylib")
    assert torch.version is not version and sys.modules["torch.version"] is not version
    assert "mylib" in activation.current_activation().callers.honest
    cudashim.deactivate()
    assert torch.version is version and sys.modules["torch.version"] is version
    assert torch.backends.cuda.is_built is is_built and torch.accelerator.current_accelerator is current
    assert activation.current_activation() is None


def test_the_report_says_who_asked_and_what_they_heard(libraries):
    program = "import bitsandbytes, mylib, torch; bitsandbytes.probe(); mylib.probe(); torch.cuda.is_available()"
    result = python("-m", "cudashim", "--report", "-c", program, env={"PYTHONPATH": str(libraries)})
    assert result.returncode == 0, result.stderr[-2000:]
    asked = result.stderr.split("who asked, and what they heard:")[1]
    line = next(line for line in asked.splitlines() if "torch.cuda.is_available" in line)
    assert "bitsandbytes: the truth" in line and "mylib: the compatible answer" in line
    assert "__main__: the compatible answer" in line
    assert "torch.version.cuda" in asked


def test_bad_policy_settings_are_refused_with_one_line():
    from cudashim import _settings
    with pytest.raises(ValueError, match="not a module name: my-lib"):
        _settings.load({}, honest_for="my-lib")
    with pytest.raises(ValueError, match="CUDASHIM_CUDA_VERSION='twelve': expected a CUDA version"):
        _settings.load({"CUDASHIM_CUDA_VERSION": "twelve"})


def test_bitsandbytes_runs_its_cpu_backend_because_it_hears_the_truth():
    pytest.importorskip("bitsandbytes")
    result = python("-m", "cudashim", "tests/programs/int8_layers.py", timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "quantized layers within" in result.stdout
    # Told "CUDA is here" instead, it loads its CUDA backend and dies on a build without CUDA.
    told = python("-m", "cudashim", "--honest-for=-bitsandbytes", "tests/programs/int8_layers.py",
                  timeout=240)
    assert told.returncode != 0 and "_cuda_getCurrentRawStream" in told.stderr


@pytest.mark.parametrize("cuda_version", ["12.8", "11.8", "13.0"])
def test_every_version_answer_describes_one_cuda_build(cuda_version):
    """torch.version.cuda, cuDNN, NCCL, the arch list, the capability and NVML's driver all
    describe a machine that could exist; torch itself hears the truth."""
    import cudashim
    cudashim.activate("cpu", cuda_version=cuda_version, report=True)
    import pynvml
    from cudashim.activation import current_activation
    major = int(cuda_version.split(".")[0])
    assert torch.version.cuda == cuda_version and torch.backends.cuda.is_built()
    assert torch.backends.cudnn.is_available() and torch.backends.cudnn.version() >= 8000
    assert torch.backends.cudnn.version() // 10000 == (8 if major < 11 else 9)
    capability = torch.cuda.get_device_capability()
    assert "sm_%d%d" % capability in torch.cuda.get_arch_list()
    nccl = torch.cuda.nccl.version()
    assert isinstance(nccl, tuple) and len(nccl) == 3 and nccl >= (2, 14, 0)
    pynvml.nvmlInit()
    assert pynvml.nvmlSystemGetCudaDriverVersion() // 1000 == major
    assert pynvml.nvmlSystemGetNVMLVersion().endswith(pynvml.nvmlSystemGetDriverVersion())
    askers = current_activation().report.askers
    for question in ("torch.backends.cudnn.version", "torch.cuda.nccl.version", "torch.cuda.get_arch_list"):
        assert askers[question][__name__] == "the compatible answer", question
    cudashim.deactivate()
    assert torch.version.cuda is None and torch.backends.cudnn.version() is None
