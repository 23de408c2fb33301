"""A stand-in for Intel Gaudi's habana_frameworks.torch in tests: the fake accelerator
named ``hpu``."""

import fake_accelerator

hpu = fake_accelerator.install("hpu")
