"""A stand-in for oneCCL's bindings: importing registers the ``ccl`` backend (gloo here)."""

import fake_accelerator

fake_accelerator.register_collective("ccl", device_type="xpu")
