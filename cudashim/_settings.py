"""Settings: declared once, read once into a frozen object.

Each setting is one ``Option`` below: its name (the keyword argument and the field), its
environment variable, how a value is parsed and checked, and its help line. The
``Settings`` class, ``load()``, the environment handed to child processes and the command
line options are all derived from that one table, so a new setting is one entry here.

Precedence: keyword arguments beat ``CUDASHIM_*`` environment variables, which beat the
defaults. Every environment variable cudashim reads is named here and nowhere else.
"""

from __future__ import annotations

import collections
import os
from typing import Any, Callable, Mapping, NamedTuple, Optional, Tuple

from . import backends, patches, substitutes
from .tables import host_profiles

ENV_ACTIVATE = "CUDASHIM_ACTIVATE"
"""Set to ``1`` by the launcher so the sitecustomize hook activates child interpreters."""

HONEST_QUESTIONS = {
    "is_available": "torch.cuda.is_available() says whether real CUDA works",
    "is_cuda": "Tensor.is_cuda is True only for real CUDA tensors",
    "get_backend": "torch.distributed.get_backend() names the real collective library",
}
UNSUPPORTED_POLICIES = ("raise", "warn")
# What a CUDA float16 request computes in (autocast, explicit float16 matmuls); see precision.py.
AMP_DTYPES = ("auto", "as-asked", "bfloat16", "float16")
TF32_POLICIES = ("auto", "ignore")


# --- parsers: (value, where) -> the checked value; ``where`` names the source in errors ----
def _parse_backend(value, where):
    name = str(value).strip().lower()
    if not name:
        raise ValueError(f"{where}: empty backend name")
    return backends.check_name(name)          # UnknownBackendError is a ValueError


def _parse_collective(value, where):
    name = str(value).strip().lower()
    if not name or name == "nccl":
        raise ValueError(f"{where}{value!r}: name the library NCCL becomes (gloo, hccl, xccl, ...)")
    return name


def _parse_count(value, where):
    try:
        count = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{where}{value!r}: expected a whole number of devices") from None
    if count < 0:
        raise ValueError(f"{where}{value!r}: the device count cannot be negative")
    return count


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _parse_bool(value, where):
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"{where}{value!r}: expected one of 1/0, true/false, yes/no, on/off")


def _name_set(valid: Callable[[], Tuple[str, ...]], what: str):
    """A parser for a comma-separated set of names, each one of ``valid()``."""
    def parse(value, where):
        items = value.split(",") if isinstance(value, str) else list(value)
        chosen = frozenset(i.strip() for i in items if i.strip())
        bad = chosen - set(valid())
        if bad:
            raise ValueError(f"{where}: unknown {what} {', '.join(sorted(bad))}; "
                             f"valid: {', '.join(valid())}")
        return chosen
    return parse


def _parse_substitutes(value, where):
    """``all``, ``none``, or the libraries to substitute (``flash_attn,pynvml``)."""
    if isinstance(value, str) and value.strip().lower() in ("all", "none"):
        return None if value.strip().lower() == "all" else frozenset()
    return _name_set(substitutes.names, "librar(y/ies) to substitute")(value, where)


def _format_substitutes(value) -> Optional[str]:
    if value is None:
        return None                              # the default: every library
    return ",".join(sorted(value)) if value else "none"


def _parse_modules(value, where):
    """Module names, each optionally prefixed with "-" (take a default one out)."""
    items = value.split(",") if isinstance(value, str) else list(value)
    chosen = frozenset(i.strip() for i in items if i.strip())
    bad = sorted(m for m in chosen if not all(part.isidentifier() for part in m.lstrip("-").split(".")))
    if bad:
        raise ValueError(f"{where}{value!r}: not a module name: {', '.join(bad)} "
                         "(give dotted module names, '-name' to take a default one out)")
    return chosen


def _parse_extensions(value, where):
    """Module names in the order given."""
    items = value.split(",") if isinstance(value, str) else list(value)
    chosen = tuple(dict.fromkeys(i.strip() for i in items if i.strip()))
    bad = [m for m in chosen if not all(part.isidentifier() for part in m.split("."))]
    if bad:
        raise ValueError(f"{where}{value!r}: not a module name: {', '.join(bad)}")
    return chosen


def _parse_cuda_version(value, where):
    text = str(value).strip()
    if text.lower() == "auto":
        return "auto"
    parts = text.split(".")
    if len(parts) not in (2, 3) or not all(part.isdigit() for part in parts):
        raise ValueError(f"{where}{value!r}: expected a CUDA version such as 12.8, or auto")
    return text


def _one_of(choices: Tuple[str, ...]):
    """A parser for one word out of ``choices``."""
    def parse(value, where):
        text = str(value).strip().lower()
        if text not in choices:
            raise ValueError(f"{where}{value!r}: expected one of {', '.join(choices)}")
        return text
    return parse


def _format_plain(value) -> Optional[str]:
    return None if value is None else str(value)


def _format_bool(value) -> str:
    return "1" if value else "0"


def _format_set(value) -> Optional[str]:
    return ",".join(sorted(value)) if value else None


def _format_sequence(value) -> Optional[str]:
    return ",".join(value) if value else None


class Option(NamedTuple):
    name: str                        # keyword argument, Settings field, --option (dashed)
    env: str                         # the environment variable
    default: Any
    parse: Callable[[Any, str], Any]
    help: str
    metavar: Optional[str] = None    # None: a flag (--report), not an option with a value
    format: Callable[[Any], Optional[str]] = _format_plain   # value -> environment text
    choices: Optional[Tuple[str, ...]] = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")


OPTIONS: Tuple[Option, ...] = (
    Option("backend", "CUDASHIM_BACKEND", backends.AUTO, _parse_backend, metavar="NAME",
           help="target backend: auto (default), or one of the backends `cudashim doctor` lists"),
    Option("device_count", "CUDASHIM_DEVICE_COUNT", None, _parse_count, metavar="N",
           help="how many CUDA devices the program sees: on the CPU, virtual ones (default 1, as "
                "many as CUDA_VISIBLE_DEVICES lists, or one per local rank); on an accelerator, "
                "more than it has, sharing them (default: its own)"),
    Option("device_extension", "CUDASHIM_DEVICE_EXTENSION", (), _parse_extensions,
           metavar="MODULE[,MODULE]", format=_format_sequence,
           help="import these device extensions before the target is chosen: a vendor's torch "
                "extension that torch does not load itself (torchvulkan, say)"),
    Option("test_devices", "CUDASHIM_TEST_DEVICES", 0, _parse_count, metavar="N",
           help="build (once, cached) and load cudashim's test accelerator with N devices whose "
                "memory the host cannot touch: try a CUDA program on a device of its own on a "
                "machine without one (needs a C++ compiler and ninja; 0, the default: off)"),
    Option("collective", "CUDASHIM_COLLECTIVE", None, _parse_collective, metavar="LIBRARY",
           help="the torch.distributed backend NCCL becomes (default: the backend's own)"),
    Option("report", "CUDASHIM_REPORT", False, _parse_bool, format=_format_bool,
           help="print at exit which CUDA APIs ran, how often, what each became"),
    Option("report_json", "CUDASHIM_REPORT_JSON", None, lambda value, where: str(value),
           metavar="PATH", help="also write the report as JSON (RANK=3 writes PATH.rank3.json)"),
    Option("honest", "CUDASHIM_HONEST", frozenset(),
           _name_set(lambda: tuple(HONEST_QUESTIONS), "question(s)"), metavar="Q[,Q]",
           format=_format_set, help="answer these truthfully: " + ", ".join(HONEST_QUESTIONS)),
    Option("honest_for", "CUDASHIM_HONEST_FOR", frozenset(), _parse_modules, metavar="MODULE[,MODULE]",
           format=_format_set,
           help="modules that hear the truth about CUDA, besides torch and the libraries that load "
                "native CUDA code (bitsandbytes, flash_attn, ...); --honest-for=-name takes one of "
                "those out"),
    Option("cuda_version", "CUDASHIM_CUDA_VERSION", "auto", _parse_cuda_version, metavar="X.Y",
           help="the torch.version.cuda the program and its libraries hear, and the cuDNN that "
                "goes with it (default auto: the running torch's own where it is a CUDA build, "
                "which the libraries built for it check, else 12.8)"),
    Option("unsupported", "CUDASHIM_UNSUPPORTED", "warn", _one_of(UNSUPPORTED_POLICIES),
           choices=UNSUPPORTED_POLICIES,
           help="harmless unsupported CUDA APIs (the CUDA profiler's start/stop, TunableOp) "
                "warn once and do nothing (warn, the default), or raise as the others do"),
    Option("amp_dtype", "CUDASHIM_AMP_DTYPE", "auto", _one_of(AMP_DTYPES), choices=AMP_DTYPES,
           help="what CUDA's float16 requests compute in: auto (the default: where float16 is "
                "slow, whichever of float16, bfloat16 and float32 this host measured fastest for "
                "each shape class), as-asked, bfloat16, float16"),
    Option("host_profile", "CUDASHIM_HOST_PROFILE", host_profiles.MEASURED, _one_of(host_profiles.NAMES),
           choices=host_profiles.NAMES,
           help="the reduced-precision speeds the precision policy follows on the CPU: measured on "
                "this CPU (the default), or those of a CPU that computes float16 and bfloat16 "
                "natively (fast), bfloat16 alone (bfloat16), or neither (slow)"),
    Option("tf32", "CUDASHIM_TF32", "auto", _one_of(TF32_POLICIES), choices=TF32_POLICIES,
           help="CUDA's TF32 flags turn on the target's reduced-precision float32 matmuls where "
                "it has them (auto, the default), or change nothing (ignore)"),
    Option("substitute", "CUDASHIM_SUBSTITUTE", None, _parse_substitutes, metavar="all|none|LIB[,LIB]",
           format=_format_substitutes,
           help="the CUDA-only libraries that get a stand-in where the real package cannot work "
                "on the target (default all: " + ", ".join(substitutes.names()) + "), or none"),
    Option("pure_python", "CUDASHIM_PURE_PYTHON", False, _parse_bool, format=_format_bool,
           help="run the pure-Python wrappers even where the compiled fast path was built "
                "(they behave the same; the compiled ones cost less per call)"),
    Option("disable", "CUDASHIM_DISABLE", frozenset(),
           _name_set(patches.names, "patch group(s)"), metavar="GROUP[,GROUP]",
           format=_format_set,
           help="leave these patch groups off (`cudashim doctor` lists them): "
                + ", ".join(patches.GROUPS)),
)
BY_NAME = {option.name: option for option in OPTIONS}


def env_var(name: str) -> str:
    """The environment variable of setting ``name``."""
    return BY_NAME[name].env


class Settings(collections.namedtuple("Settings", [option.name for option in OPTIONS],
                                      defaults=[option.default for option in OPTIONS])):
    """The settings in force (see OPTIONS): read-only, compared and hashed by value.

    A named tuple rather than a frozen dataclass: every ``import cudashim`` builds it, and a
    dataclass compiles its six generated methods there (about 2 ms of each start-up)."""
    __slots__ = ()

    @staticmethod
    def spelled(name: str, value: str) -> str:
        """How a user sets setting ``name`` to ``value``: its flag, and its variable."""
        option = BY_NAME[name]
        return f"{option.flag} {value} ({option.env}={value})"

    def is_honest(self, question: str) -> bool:
        return question in self.honest

    def substitutes(self, library: str) -> bool:
        """Whether ``library`` may get a stand-in (``--substitute``)."""
        return self.substitute is None or library in self.substitute

    def is_enabled(self, group: str) -> bool:
        return group not in self.disable

    def as_kwargs(self) -> dict:
        """These settings as the keyword arguments of ``load()`` / ``activate()``."""
        return {option.name: getattr(self, option.name) for option in OPTIONS}

    def to_environ(self) -> dict:
        """The environment that makes a child interpreter load these same settings."""
        env = {}
        for option in OPTIONS:
            text = option.format(getattr(self, option.name))
            if text is not None:
                env[option.env] = text
        return env


def load(environ: Optional[Mapping[str, str]] = None, **overrides) -> "Settings":
    """Build Settings from keyword arguments, then the environment, then defaults.

    Raises ValueError with one clear line for any malformed value, TypeError for a keyword
    that is no setting.
    """
    environ = os.environ if environ is None else environ
    unknown = set(overrides) - set(BY_NAME)
    if unknown:
        raise TypeError(f"unknown cudashim setting(s): {', '.join(sorted(unknown))}; "
                        f"valid: {', '.join(BY_NAME)}")
    values = {}
    for option in OPTIONS:
        given = overrides.get(option.name)
        if given is not None:
            values[option.name] = option.parse(given, f"{option.name}=")
            continue
        raw = environ.get(option.env)
        if raw is not None and raw != "":
            values[option.name] = option.parse(raw, f"{option.env}=")
    return Settings(**values)
