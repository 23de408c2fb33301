"""The device translator: the one place where CUDA vocabulary becomes the target's.

Specs are parsed with the real ``torch.device``, never matched as substrings, so a
malformed spec fails exactly as torch fails for it and a path containing "cuda" is left
alone. Parsed strings and device objects are cached: a translated call costs one dict
lookup, and in the compiled wrappers a call passing the object translated last (the one
device a program passes everywhere) costs a pointer comparison. Integers are CUDA indices
only where the caller says so (``t.to(0)``).
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .errors import invalid_device_ordinal

_CACHE_LIMIT = 512
_UNCHANGED = object()      # cached for specs that are not CUDA: hand back the caller's object


class DeviceTranslator:
    """Turns CUDA device specs into target devices.

    ``translate(spec)`` returns the target device for a CUDA spec and ``spec`` itself for
    anything else. ``for_api(name)`` returns the translate function a patch of ``name``
    should call: the shared one, or, when the report is on, one that counts the call.
    """

    def __init__(self, backend, report=None):
        self.backend = backend
        self.report = report
        self.cache: dict = {}         # spec -> translated spec, or _UNCHANGED
        self.indices: dict = {}       # int -> translated device (apart: True == 1 as a key)
        self.named: dict = {}         # spec string -> the device it stands for, translated
        self.translate = self._build()

    def _build(self):
        real_device = torch._C.device
        backend = self.backend
        check_index = getattr(backend, "check_index", None) or _check_index_against(backend)
        target_device = backend.target_device
        cache, indices = self.cache, self.indices

        def parse(spec):
            if spec.__class__ is int:
                index = spec
                if index < 0:
                    return real_device(index)             # torch's own error for a negative index
            else:
                device = spec if spec.__class__ is real_device else real_device(spec)
                if device.type != "cuda":
                    return spec
                index = device.index
            if index is not None:
                check_index(index)
            return target_device(index)

        def slow(spec):
            if spec.__class__ is bool or not isinstance(spec, (str, int, real_device)):
                return spec
            result = parse(spec)
            table = indices if spec.__class__ is int else cache
            if len(table) < _CACHE_LIMIT:
                table[spec] = _UNCHANGED if result is spec else result
            return result

        def translate(spec):
            try:
                result = (indices if spec.__class__ is int else cache)[spec]
            except KeyError:
                return slow(spec)
            except TypeError:                             # unhashable: not a device spec
                return spec
            return spec if result is _UNCHANGED else result

        return translate

    def for_api(self, api: str) -> Callable[[Any], Any]:
        if self.report is None:
            return self.translate
        translate, count = self.translate, self.report.count

        def translate_and_count(spec):
            result = translate(spec)
            if result is not spec:
                count(api, result)
            return result

        return translate_and_count

    def compiled_translation(self, translate):
        """``translate`` with the caches the compiled wrappers read directly:
        (translate, cache, indices, unchanged marker). A counting translate has none, so
        every call reaches it and is counted."""
        if translate is self.translate:
            return translate, self.cache, self.indices, _UNCHANGED
        return translate, None, None, _UNCHANGED

    def device_named_for(self, api: str) -> Callable[[str], "torch.device"]:
        """``torch.device(spec)`` for a spec string, translated: the target device for a
        CUDA spec, the parsed device otherwise. Cached, so ``torch.device("cpu")`` costs a
        lookup; while the report counts calls, every call is translated and counted."""
        translate, real_device = self.for_api(api), torch._C.device
        named = self.named

        def device_named(spec):
            target = translate(spec)
            if target is not spec:
                return target
            # A spec left as it is ("cpu") names one object, counted or not: the moves tell the
            # host's device from the target's by identity where both are the host (residency).
            device = named.get(spec)
            if device is None:
                device = real_device(spec)
                if len(named) < _CACHE_LIMIT:
                    named[spec] = device
            return device

        if self.report is not None:
            return device_named           # every call translated, and counted where it is

        def cached(spec):
            device = named.get(spec)
            if device is None:
                device = device_named(spec)
                if len(named) < _CACHE_LIMIT:
                    named[spec] = device      # devices are immutable: sharing one is safe
            return device

        cached.named = named          # the compiled torch.device reads it directly
        return cached

    def host_device(self) -> "torch.device":
        """The device the program's ``torch.device("cpu")`` returns: one object for the run."""
        return self.named.setdefault("cpu", torch._C.device("cpu"))

    def type_for(self, api: str) -> Callable[[Any], Any]:
        """A translator for device *type* strings ("cuda" -> the target's type); it counts
        each translated call when the report is on."""
        target, report = self.backend.device_type, self.report

        def translate_type(device_type):
            if device_type == "cuda":
                if report is not None:
                    report.count(api, target)
                return target
            return device_type
        return translate_type


def _check_index_against(backend):
    def check(index):
        count = backend.device_count()
        if not 0 <= index < count:
            raise invalid_device_ordinal(index, count, f"the {backend.name} backend")
    return check
