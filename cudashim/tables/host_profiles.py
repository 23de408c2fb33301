"""Host profiles: the reduced-precision speeds of the CPUs a host can stand in for.

The precision policy follows what the host computes fast (``backends/cpu_speed.py``), so a
float16 program's numbers differ between a CPU that computes float16 natively and one that
emulates it. A host profile (``--host-profile``, ``CUDASHIM_HOST_PROFILE``) gives the answers such
a CPU gives, whatever this one is: a test that depends on the policy's choice names the profile
it tests, and CI runs the suite under each profile on one machine.
"""

MEASURED = "measured"

# profile -> (what it stands for, which dtypes it computes fast, and, where float16 is slow, the
# choices it measures for explicit float16 matmuls: memory-bound, compute-bound, memory-bound rows)
PROFILES = {
    "fast": ("a CPU that computes float16 and bfloat16 natively (AMX-FP16, AVX512-FP16)",
             {"float16": True, "bfloat16": True}, None),
    "bfloat16": ("a CPU that computes bfloat16 natively and emulates float16 (AVX512_BF16, AMX-BF16)",
                 {"float16": False, "bfloat16": True}, ("as-asked", "bfloat16", 4)),
    "slow": ("a CPU that emulates both (AVX2 and older)",
             {"float16": False, "bfloat16": False}, ("as-asked", "float32", 4)),
}

NAMES = (MEASURED, *PROFILES)
