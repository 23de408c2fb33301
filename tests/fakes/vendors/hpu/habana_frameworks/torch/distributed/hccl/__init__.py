"""Importing this registers Habana's ``hccl`` process-group backend (run by gloo here)."""

import fake_accelerator

fake_accelerator.register_collective("hccl")
