"""Host profiles: the reduced-precision speeds of the CPUs a host can stand in for.

The precision policy follows what the host computes fast (``backends/cpu_speed.py``), so a
float16 program's numbers differ between a CPU that computes float16 natively and one that
emulates it. A host profile (``--host-profile``, ``CUDASHIM_HOST_PROFILE``) gives the answers such
a CPU gives, whatever this one is: a test that depends on the policy's choice names the profile
it tests, and CI runs the suite under each profile on one machine.
"""

MEASURED = "measured"

# profile -> (what it stands for, which dtypes it computes fast, and, where float16 is slow, the
# choices it measures for explicit float16 matmuls and for attention: memory-bound (decoding),
# compute-bound, memory-bound rows). Attention in float32 on both: one query over a cache of 256
# took 0.10 ms so (its conversions counted) against 0.50 as asked and 0.14 in bfloat16 on an
# AVX-512 BF16 EPYC, 0.07 against 0.34 with torch's kernels pinned to AVX2; a prefill of 256
# positions 2.1 ms against 4.4 and 2.5, and 1.8 against 3.5 and 2.0.
PROFILES = {
    "fast": ("a CPU that computes float16 and bfloat16 natively, float16 as fast as bfloat16 (AMX-FP16)",
             {"float16": True, "bfloat16": True}, None, None),
    "bfloat16": ("a CPU that computes bfloat16 natively and float16 no faster than float32 (AVX512_BF16, "
                 "AMX-BF16; with or without AVX512-FP16)",
                 {"float16": False, "bfloat16": True}, ("as-asked", "bfloat16", 4),
                 ("float32", "float32", 256)),
    "slow": ("a CPU that emulates both (AVX2 and older)",
             {"float16": False, "bfloat16": False}, ("as-asked", "float32", 4),
             ("float32", "float32", 256)),
}

NAMES = (MEASURED, *PROFILES)
