"""The one interface every backend implements.

Grouped by concern: identity and presence, devices, RNG, streams and events, memory,
dtypes and kernels, communication. Most methods delegate to the device module
(``torch.get_device_module(device_type)``, resolved once when the backend is built, before
anything is patched), so a backend only overrides what its device module lacks. Methods
take ``index``, a CUDA-style device index (``None`` = the current device).

Methods marked ``@cuda_api`` answer the ``torch.cuda`` function of the same name: the proxy
``torch.cuda`` generates its forwarder from the mark, turning torch.cuda's ``device``
argument into ``index``. A new forwarded ``torch.cuda`` function is one marked method here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from typing import ClassVar, Optional, Tuple

import torch

from ..errors import BackendUnavailableError, warn_once

logger = logging.getLogger(__name__)


def cuda_api(method):
    """Mark ``method`` (or a property) as the answer to the ``torch.cuda`` name it bears."""
    (method.fget if isinstance(method, property) else method).cuda_api = True
    return method


def cuda_api_names(cls) -> Tuple[str, ...]:
    """The ``torch.cuda`` names ``cls`` answers (marked along its bases)."""
    names = set()
    for klass in reversed(cls.__mro__):
        for name, value in vars(klass).items():
            target = value.fget if isinstance(value, property) else value
            if getattr(target, "cuda_api", False):
                names.add(name)
    return tuple(sorted(names))


class Backend:
    # --- identity ---------------------------------------------------------------------
    name: ClassVar[str]                       # what users pass to --backend (its module's name)
    # Where ``auto`` tries it, lowest first: real CUDA (0), the vendors (10-40), the generic
    # accelerator backend (90), the CPU (100). Entry-point backends go before the generic one.
    detection_rank: ClassVar[int] = 50
    device_type: ClassVar[str]                # the torch device type tensors live on
    default_collective: ClassVar[str] = "gloo"  # torch.distributed backend replacing NCCL
    visible_devices_var: ClassVar[Optional[str]] = None   # vendor's CUDA_VISIBLE_DEVICES
    vendor_package: ClassVar[Optional[str]] = None        # import name, when one is needed
    # Other packages it uses where they are installed (a collective library, kernels):
    # doctor says whether each is there.
    optional_packages: ClassVar[Tuple[str, ...]] = ()
    install_hint: ClassVar[str] = ""          # how to install the vendor package
    # How to tell a user whose machine lacks the device; the backend fills in the details.
    device_hint: ClassVar[str] = ""
    redirects: ClassVar[bool] = True          # False only for CUDA pass-through
    profiler_activity: ClassVar[Optional[str]] = None     # ProfilerActivity replacing CUDA
    # Kernel languages whose compilers build for the device ("triton" on XPU); CUDA C++ and
    # triton kernels in a program run only where their language is listed.
    kernel_languages: ClassVar[Tuple[str, ...]] = ()
    # DeepSpeed's name for its accelerator for this target (DS_ACCELERATOR), where it has one.
    deepspeed_accelerator: ClassVar[Optional[str]] = None

    # Whether ``--device-count`` sets how many CUDA devices the program sees (more than the
    # real ones share them). Elsewhere the program sees the real devices, and is told so.
    honours_device_count = False

    def __init__(self, settings):
        self.settings = settings
        if getattr(settings, "device_count", None) is not None and not self.honours_device_count:
            warn_once("device-count-ignored",
                      f"--device-count applies to the cpu and accelerator backends; the "
                      f"'{self.name}' backend shows the program its real devices")
        # Resolved once, before patching: a delegated call never passes through cudashim's
        # own torch.get_device_module patch.
        self.module = self.device_module()

    # --- presence (class-level: asked before a backend is built) ----------------------
    @classmethod
    def vendor_package_found(cls) -> bool:
        return cls.vendor_package is None or module_found(cls.vendor_package)

    @classmethod
    def absent_reason(cls) -> Optional[str]:
        """None when the backend can run here, else what is missing and how to install it.

        The vendor package is imported here, and only here: whether the device is present
        is something only it can say, and a backend that is not asked imports nothing.
        """
        if not cls.vendor_package_found():
            return f"the vendor package '{cls.vendor_package}' is not installed ({cls.install_hint})"
        if cls.vendor_package is not None:
            try:
                importlib.import_module(cls.vendor_package)
            except Exception as exc:                  # a broken vendor install
                return (f"the vendor package '{cls.vendor_package}' failed to import "
                        f"({type(exc).__name__}: {exc}); {cls.install_hint}")
        return cls.device_absent_reason()

    @classmethod
    def device_absent_reason(cls) -> Optional[str]:
        """None when the device module reports a device, else why not."""
        device_module = getattr(torch, cls.device_type, None)
        if device_module is None:
            return f"torch has no 'torch.{cls.device_type}' module ({cls.device_hint})"
        if not device_module.is_available():
            return f"no {cls.device_type.upper()} device: torch.{cls.device_type}.is_available() " \
                   f"is False ({cls.device_hint})"
        return None

    def device_module(self):
        """The torch device module this backend delegates to."""
        return torch.get_device_module(self.device_type)

    # --- devices ----------------------------------------------------------------------
    def native_answers(self) -> dict:
        """{torch.cuda name: a C callable (no Python frame) that answers exactly as the
        method of that name}, for the hottest questions; none by default."""
        return {}

    # Whether several CUDA indices stand for one real device (the CPU's virtual devices).
    shares_devices = False
    # Whether the target's device memory is the host's own, with one device type for both
    # (the CPU backend): then torch's move between them is an alias, and cudashim makes the
    # copy CUDA makes (``cudashim.residency``).
    device_memory_is_host = False
    # Whether the target's kernels are the host CPU's own, torch's CPU kernels: then long
    # reductions are blocked to CUDA's accuracy (``patches/reductions.py``).
    computes_with_host_kernels = False

    @cuda_api
    def device_count(self) -> int:
        return self.module.device_count()

    def target_device(self, index: Optional[int]) -> "torch.device":
        """The real device a CUDA index stands for; None keeps "the current device" open,
        as ``torch.device("cuda")`` does."""
        return torch.device(self.device_type) if index is None else torch.device(self.device_type, index)

    @cuda_api
    def current_device(self) -> int:
        return self.module.current_device()

    def set_device(self, index: int) -> None:
        self.module.set_device(index)

    @cuda_api
    def synchronize(self, index: Optional[int] = None) -> None:
        self.module.synchronize(index)

    @cuda_api
    def get_device_name(self, index: Optional[int] = None) -> str:
        return self.module.get_device_name(index)

    @cuda_api
    def get_device_properties(self, index: Optional[int] = None):
        return self.module.get_device_properties(index)

    @cuda_api
    def get_device_capability(self, index: Optional[int] = None) -> Tuple[int, int]:
        # Programs gate features on compute capability; 8.0 (Ampere) selects bf16 paths.
        return (8, 0)

    @cuda_api
    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return self.module.is_bf16_supported()

    # --- RNG --------------------------------------------------------------------------
    @cuda_api
    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed(seed)

    @cuda_api
    def manual_seed_all(self, seed: int) -> None:
        self.module.manual_seed_all(seed)

    @cuda_api
    def seed(self) -> None:
        self.module.seed()

    @cuda_api
    def seed_all(self) -> None:
        self.module.seed_all()

    @cuda_api
    def initial_seed(self) -> int:
        return self.module.initial_seed()

    @cuda_api
    def get_rng_state(self, index: Optional[int] = None) -> "torch.Tensor":
        return self.module.get_rng_state(self.target_device(index))

    @cuda_api
    def set_rng_state(self, new_state, index: Optional[int] = None) -> None:
        self.module.set_rng_state(new_state, self.target_device(index))

    def default_generator(self, index: int) -> "torch.Generator":
        return self.module.default_generators[index]

    # --- streams and events -----------------------------------------------------------
    @cuda_api
    @property
    def Stream(self):
        return self.module.Stream

    @cuda_api
    @property
    def Event(self):
        return self.module.Event

    @cuda_api
    def current_stream(self, index: Optional[int] = None):
        return self.module.current_stream(index)

    @cuda_api
    def default_stream(self, index: Optional[int] = None):
        return self.module.default_stream(index)

    def set_stream(self, stream) -> None:
        self.module.set_stream(stream)

    def stream(self, stream):
        return self.module.stream(stream)

    # --- graphs -----------------------------------------------------------------------
    # The device module's class of CUDA-graph-like capture and replay, where the target has
    # one (``torch.xpu.XPUGraph``, torch_npu's ``torch.npu.NPUGraph``), beside ``graph``,
    # ``graph_pool_handle``, ``make_graphed_callables`` and ``is_current_stream_capturing``.
    graph_class: ClassVar[Optional[str]] = None
    GRAPH_NAMES: ClassVar[Tuple[str, ...]] = ("graph", "graph_pool_handle", "make_graphed_callables",
                                              "is_current_stream_capturing")

    def native_graphs(self):
        """The device module where it captures and replays graphs of its own, else None (a
        build whose graph class is a placeholder, as torch's are where not compiled in, too)."""
        names = (self.graph_class,) + self.GRAPH_NAMES if self.graph_class else ()
        if not names or not all(hasattr(self.module, name) for name in names):
            return None
        try:
            getattr(self.module, self.graph_class)()
        except Exception as exc:
            logger.info("%s: %s.%s cannot be made here (%s); graphs are recorded instead",
                        self.name, self.module.__name__, self.graph_class, exc)
            return None
        return self.module

    # --- memory -----------------------------------------------------------------------
    @cuda_api
    def memory_allocated(self, index: Optional[int] = None) -> int:
        return self.module.memory_allocated(index)

    @cuda_api
    def max_memory_allocated(self, index: Optional[int] = None) -> int:
        return self.module.max_memory_allocated(index)

    @cuda_api
    def memory_reserved(self, index: Optional[int] = None) -> int:
        return self.module.memory_reserved(index)

    @cuda_api
    def max_memory_reserved(self, index: Optional[int] = None) -> int:
        return self.module.max_memory_reserved(index)

    @cuda_api
    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        self.module.reset_peak_memory_stats(index)

    @cuda_api
    def memory_stats(self, index: Optional[int] = None) -> dict:
        return self.module.memory_stats(index)

    @cuda_api
    def mem_get_info(self, index: Optional[int] = None) -> Tuple[int, int]:
        return self.module.mem_get_info(index)

    @cuda_api
    def empty_cache(self) -> None:
        self.module.empty_cache()

    # --- dtypes and kernels -----------------------------------------------------------
    def autocast_dtypes(self) -> Tuple["torch.dtype", ...]:
        return (torch.bfloat16, torch.float16)

    def dtype_speeds(self) -> Tuple[dict, str]:
        """({float16: fast?, bfloat16: fast?}, how that is known): whether the device computes
        each reduced-precision dtype fast, or slowly (emulated). Asked by the precision policy
        at activation, never on a hot path."""
        try:
            fast_bfloat16 = bool(self.is_bf16_supported(including_emulation=False))
        except Exception:                          # a vendor build that cannot tell
            fast_bfloat16 = True
        return ({torch.float16: True, torch.bfloat16: fast_bfloat16},
                f"accelerators compute reduced precision natively (torch.{self.device_type})")

    def float16_matmul_choices(self):
        """What explicit float16 matmuls compute in, per shape class (precision.MatmulChoices).
        Accelerators: one choice from the dtypes' speeds. Asked when first needed."""
        from ..precision import MatmulChoices
        return MatmulChoices.from_dtype_speeds(*self.dtype_speeds())

    def float16_op_choices(self) -> dict:
        """What the float16 ops outside the matmul family compute in, timed on the target
        (``cpu_speed.op_choices``). Accelerators: every op as asked."""
        return {}

    def sdpa_backends(self) -> frozenset:
        """The scaled-dot-product-attention kernels the target really has."""
        from torch.nn.attention import SDPBackend
        return frozenset({SDPBackend.MATH})

    def can_pin_memory(self) -> bool:
        return True

    # --- communication ----------------------------------------------------------------
    @functools.cached_property
    def collective(self) -> str:
        """The collective library: the setting when given, else the backend's choice."""
        return self.settings.collective or self.choose_collective()

    def choose_collective(self) -> str:
        return self.default_collective

    def process_group_backend(self) -> str:
        """What ``init_process_group()`` with NCCL, or with no backend, becomes."""
        return f"cpu:gloo,{self.device_type}:{self.collective}"

    def describe(self) -> str:
        return f"{self.name} (device type '{self.device_type}', collectives '{self.collective}')"


def module_found(name: str) -> bool:
    """Whether ``name`` (dotted or not) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):           # a dotted name whose parent is missing
        return False


def no_collective(backend: str, missing: str) -> BackendUnavailableError:
    return BackendUnavailableError(
        f"cudashim backend '{backend}' has no collective library for NCCL to become: {missing}; "
        f"or name one with --collective / CUDASHIM_COLLECTIVE")


def vendor_lookup(module, name: str):
    """What a vendor module's own ``__getattr__`` answers for ``name`` (torchvulkan makes its
    ``default_generators`` there), or None: no such hook, or no such name. Names cudashim
    adds to the module later (the device_module group) do not hide it."""
    hook = vars(module).get("__getattr__")
    if hook is None:
        return None
    try:
        return hook(name)
    except AttributeError:
        return None
