"""The scan's rules: one id per kind of finding, what it means, and the runtime table it reads.

The ids are stable (``--json`` and SARIF reports carry them, and ``--explain RULE`` prints the
entry). Each rule names the runtime table or patch group that decides what the run does, so
the scan's verdict and the run come from the same place; ``tests/test_scan.py`` checks that
every entry of those tables reaches a rule.
"""

from __future__ import annotations

import dataclasses
from typing import Dict


@dataclasses.dataclass(frozen=True)
class Rule:
    id: str
    name: str
    explanation: str
    decided_by: str                 # the runtime table or patch group the verdict comes from


_RULES = (
    Rule("CS101", "cuda-api",
         "A name in torch.cuda or one of its submodules. The proxy torch.cuda answers it for the "
         "target's device, implements it, or refuses it with UnsupportedCudaAPI; the scan "
         "classifies the name exactly as the proxy does.",
         "cudashim/tables/cuda_surface.py (the proxy's classification)"),
    Rule("CS102", "cuda-graphs",
         "CUDA graphs (CUDAGraph, torch.cuda.graph, make_graphed_callables, graph pools). The "
         "target's own graph class runs them where the backend has one; elsewhere cudashim "
         "records the captured ops and replays them.",
         "cudashim/graphs and Backend.graph_class"),
    Rule("CS103", "device-spec",
         "A CUDA device spec ('cuda', 'cuda:1', f'cuda:{rank}', an index given to a CUDA API). "
         "It becomes the target's device. An index the target has no device for fails as on a "
         "CUDA machine with fewer GPUs: on the CPU backend run with --device-count N.",
         "the backend's device translation and --device-count"),
    Rule("CS104", "process-group",
         "An NCCL process group ('nccl', 'cpu:gloo,cuda:nccl'). It becomes the target's "
         "collective library.", "Backend.default_collective"),
    Rule("CS105", "visible-devices",
         "CUDA_VISIBLE_DEVICES: copied to the target runtime's own variable, or, on the CPU "
         "backend, the number of virtual devices.", "Backend.visible_devices_var"),
    Rule("CS106", "nccl-environment",
         "An NCCL environment variable: mapped to the target's collective library where it has "
         "a counterpart.", "cudashim/patches/_nccl_environment.py"),
    Rule("CS107", "cuda-flag",
         "A torch.backends.cuda / cudnn flag. TF32 flags switch the target's reduced-precision "
         "float32 matmul where it has one; the other flags are harmless where they do not apply.",
         "cudashim/patches/flags.py"),
    Rule("CS108", "version-answer",
         "A CUDA or cuDNN version or availability question (torch.version.cuda, "
         "torch.backends.cudnn.version()): answered from the CUDA build the program hears "
         "(--cuda-version), never None.", "cudashim/cuda_build.py"),
    Rule("CS109", "tensor-device",
         ".cuda() and .is_cuda on tensors and modules: they move to and test for the target's "
         "device.", "cudashim/patches/tensors.py"),
    Rule("CS110", "substituted-library",
         "A CUDA-only library cudashim serves a stand-in for (flash_attn, xformers, apex, "
         "pynvml, ...), even where torch or another package imported the real one before "
         "cudashim activated.", "cudashim/tables/libraries.py (stand-ins)"),
    Rule("CS111", "framework-accelerator",
         "A framework's accelerator layer (DeepSpeed's get_accelerator, Lightning's and "
         "accelerate's device choice): cudashim names the target's accelerator to it.",
         "cudashim/patches/frameworks.py"),
    Rule("CS112", "data-parallel",
         "DataParallel, nn.parallel.data_parallel and torch.cuda.comm over several CUDA devices: "
         "run over the target's devices. It needs as many devices as its device_ids name.",
         "cudashim/patches/data_parallel.py and --device-count"),
    Rule("CS113", "kernel-gap",
         "A torch function whose CUDA kernel accepts dtypes the target's does not (torch.abs on "
         "bool, FFTs in float16, grid_sample in float16 on torch 2.4, antialiased interpolate in "
         "float16 and bfloat16): cudashim's kernel package fills the gap.",
         "cudashim/tables/dtype_gaps.py and dtype_gaps_by_release.py"),
    Rule("CS114", "private-entry-point",
         "A private torch entry point that libraries call with a device. Those in cudashim's "
         "table are redirected; other private torch.cuda names reach no CUDA on the target.",
         "cudashim/tables/device_parameters.py (PRIVATE_ENTRY_POINTS)"),
    Rule("CS115", "device-mesh",
         "A call of torch's device-mesh stack on a CUDA mesh (DeviceMesh, DTensor and its random "
         "state, FSDP2, tensor parallelism, distributed checkpoints, pipeline schedules): it runs on "
         "the target's mesh.", "cudashim/tables/meshes.py, cudashim/patches/distributed"),
    Rule("CS201", "device-name-compare",
         "A string compare against the real device's name (x.device.type == 'cuda'). No shim "
         "can change what a string compare sees: on the target the device is the real one. "
         "When the branch the target takes raises, asserts or exits, the program must change; "
         "when it takes a slower or different path, the finding says which, and does not block.",
         "none: plain Python, out of any shim's reach"),
    Rule("CS202", "precision-check",
         "A dtype test (out.dtype == torch.float16) in a program that uses autocast: under "
         "cudashim's precision policy autocast may compute in another dtype on this target, so "
         "the test can see that dtype.", "cudashim/precision.py (the precision policy)"),
    Rule("CS203", "cuda-toolkit",
         "The CUDA toolkit (CUDA_HOME, /usr/local/cuda) or NVIDIA's tools (nvidia-smi, nvcc), "
         "run or read: the target has neither.", "none: outside the Python process"),
    Rule("CS204", "move-by-tensor-device",
         "A move to a device read off a tensor (x.to(y.device)) where the program then writes in "
         "place into the result or into the tensor it moved (a staging buffer refilled at the next "
         "turn). Where the target's device memory is host memory (the CPU backend), a device read "
         "off a tensor moved or made on the device, a parameter, or a tensor moved to the host "
         "names that side, and the move copies as on CUDA; one read off an op's result "
         "(logits.device) does not say whether it means the host or the device, so the move keeps "
         "torch's answer: where x is on the host, the result is x itself, where CUDA makes a copy, "
         "and a write to either changes both. A device read off a parameter (layer.weight.device) "
         "or a module by its name (model.device, as Hugging Face models answer) is not reported. Moves by name ('cuda', .cuda(), .cpu()) copy as on CUDA.",
         "cudashim/patches/residency.py (destination, _side_device)"),
    Rule("CS205", "move-by-device-string",
         "A move to a string made from a device (x.to(str(d)), x.to(d.type), model.to(f'{d}')). On "
         "the CPU backend every device's string is 'cpu', the host's name, which no run can tell "
         "from the program's own 'cpu': what it moves lands in host memory. A move of pinned memory "
         "or of a tensor moved to the host returns that tensor, a later .cpu() of what it moved "
         "returns it itself (a best-weights snapshot shares the live weights), where CUDA copies, "
         "and device-memory counts leave it out.",
         "none: a string is plain Python; move by the device object or by name"),
    Rule("CS301", "cuda-only-library",
         "A library that runs only on NVIDIA GPUs and that cudashim has no stand-in for.",
         "cudashim/tables/libraries.py"),
    Rule("CS302", "cuda-kernel",
         "A kernel written for NVIDIA GPUs (triton, numba.cuda): it runs where the target "
         "compiles that language; a triton kernel elsewhere runs through Triton's interpreter.",
         "Backend.kernel_languages, cudashim/patches/triton"),
    Rule("CS303", "cuda-extension",
         "A CUDA C++ extension build (CUDAExtension, load with .cu sources): refused with "
         "UnsupportedCudaAPI at run time.", "cudashim/patches/extensions.py"),
    Rule("CS304", "cuda-library-file",
         "A CUDA library loaded by hand (ctypes.CDLL('libcudart.so')).",
         "none: native code"),
)

RULES: Dict[str, Rule] = {rule.id: rule for rule in _RULES}
BY_NAME: Dict[str, Rule] = {rule.name: rule for rule in _RULES}


def rule(name_or_id: str) -> Rule:
    """The rule with this id (``CS201``) or name (``device-name-compare``); KeyError if none."""
    found = RULES.get(name_or_id.upper()) or BY_NAME.get(name_or_id.lower())
    if found is None:
        raise KeyError(f"no scan rule {name_or_id!r}; the rules are "
                       f"{', '.join(f'{r.id} ({r.name})' for r in _RULES)}")
    return found
