"""Settings: read once into a frozen object.

Precedence: keyword arguments beat ``CUDASHIM_*`` environment variables, which beat the
defaults. Every environment variable cudashim reads is named here and nowhere else.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional

# --- environment variables (the only place their names are spelled) -------------------
ENV_BACKEND = "CUDASHIM_BACKEND"
"""Backend name (``cpu``, ``cuda``, ...) or ``auto`` to detect."""
ENV_DEVICE_COUNT = "CUDASHIM_DEVICE_COUNT"
"""How many virtual CUDA devices the CPU backend exposes (default 1)."""
ENV_COLLECTIVE = "CUDASHIM_COLLECTIVE"
"""The torch.distributed backend NCCL becomes (default: the backend's own choice)."""
ENV_REPORT = "CUDASHIM_REPORT"
"""``1`` prints, at exit, which CUDA APIs the program used and what each became."""
ENV_REPORT_JSON = "CUDASHIM_REPORT_JSON"
"""Path of a JSON copy of the report; the rank is inserted when ``RANK`` is set."""
ENV_HONEST = "CUDASHIM_HONEST"
"""Comma-separated questions answered truthfully instead of compatibly (see HONEST_QUESTIONS)."""
ENV_UNSUPPORTED = "CUDASHIM_UNSUPPORTED"
"""``raise`` (default) or ``warn``: harmless unsupported APIs (nvtx, profiler ranges) warn once."""
ENV_ACTIVATE = "CUDASHIM_ACTIVATE"
"""Set to ``1`` by the launcher so the sitecustomize hook activates child interpreters."""

BACKEND_AUTO = "auto"

HONEST_QUESTIONS = {
    "is_available": "torch.cuda.is_available() says whether real CUDA works",
    "is_cuda": "Tensor.is_cuda is True only for real CUDA tensors",
    "get_backend": "torch.distributed.get_backend() names the real collective library",
}
UNSUPPORTED_POLICIES = ("raise", "warn")


@dataclasses.dataclass(frozen=True)
class Settings:
    backend: str = BACKEND_AUTO
    device_count: Optional[int] = None
    collective: Optional[str] = None
    report: bool = False
    report_json: Optional[str] = None
    honest: frozenset = frozenset()
    unsupported: str = "raise"

    def is_honest(self, question: str) -> bool:
        return question in self.honest

    def as_kwargs(self) -> dict:
        """These settings as the keyword arguments of ``load()`` / ``activate()``."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def to_environ(self) -> dict:
        """The environment that makes a child interpreter load these same settings."""
        env = {ENV_BACKEND: self.backend, ENV_UNSUPPORTED: self.unsupported,
               ENV_REPORT: "1" if self.report else "0"}
        if self.device_count is not None:
            env[ENV_DEVICE_COUNT] = str(self.device_count)
        if self.collective:
            env[ENV_COLLECTIVE] = self.collective
        if self.report_json:
            env[ENV_REPORT_JSON] = self.report_json
        if self.honest:
            env[ENV_HONEST] = ",".join(sorted(self.honest))
        return env


def load(environ: Optional[Mapping[str, str]] = None, **overrides) -> Settings:
    """Build Settings from keyword arguments, then the environment, then defaults.

    Raises ValueError with one clear line for any malformed value.
    """
    environ = os.environ if environ is None else environ
    fields = {f.name for f in dataclasses.fields(Settings)}
    unknown = set(overrides) - fields
    if unknown:
        raise TypeError(f"unknown cudashim setting(s): {', '.join(sorted(unknown))}; "
                        f"valid: {', '.join(sorted(fields))}")
    given = {k: v for k, v in overrides.items() if v is not None}

    def pick(name, env_name, parse):
        if name in given:
            return parse(given[name], f"{name}=")
        raw = environ.get(env_name)
        if raw is None or raw == "":
            return dataclasses.fields(Settings)[_index(name)].default
        return parse(raw, f"{env_name}=")

    return Settings(
        backend=pick("backend", ENV_BACKEND, _parse_backend),
        device_count=pick("device_count", ENV_DEVICE_COUNT, _parse_count),
        collective=pick("collective", ENV_COLLECTIVE, _parse_collective),
        report=pick("report", ENV_REPORT, _parse_bool),
        report_json=pick("report_json", ENV_REPORT_JSON, lambda v, _: str(v)),
        honest=pick("honest", ENV_HONEST, _parse_honest),
        unsupported=pick("unsupported", ENV_UNSUPPORTED, _parse_unsupported),
    )


def _index(name: str) -> int:
    return [f.name for f in dataclasses.fields(Settings)].index(name)


def _parse_backend(value, where):
    name = str(value).strip().lower()
    if not name:
        raise ValueError(f"{where}: empty backend name")
    return name


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


def _parse_honest(value, where):
    items = value.split(",") if isinstance(value, str) else list(value)
    chosen = frozenset(i.strip() for i in items if i.strip())
    bad = chosen - set(HONEST_QUESTIONS)
    if bad:
        raise ValueError(f"{where}: unknown question(s) {', '.join(sorted(bad))}; "
                         f"valid: {', '.join(sorted(HONEST_QUESTIONS))}")
    return chosen


def _parse_unsupported(value, where):
    text = str(value).strip().lower()
    if text not in UNSUPPORTED_POLICIES:
        raise ValueError(f"{where}{value!r}: expected one of {', '.join(UNSUPPORTED_POLICIES)}")
    return text
