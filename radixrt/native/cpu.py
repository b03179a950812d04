"""What this CPU can do, read from /proc/cpuinfo (stdlib only), and which of its instruction
sets radixrt's native kernels are built for.

The kernels are compiled for the machine (-march=native) and pick their paths at compile time
(AVX-512 where the CPU has it, else AVX2 + FMA). RADIXRT_CPU_ISA=avx2 builds them as for a
CPU without AVX-512 and AMX (and reports no bf16 units, so `dtype auto` decides as it would
there), so that one machine can run, test and measure every path it supports. A CPU without
AVX2, FMA and F16C gets no native kernels: the torch paths run instead (native/build.py).
"""

from __future__ import annotations

import functools
import os

ISA_ENV = "RADIXRT_CPU_ISA"
ISAS = ("native", "avx2")  # the values ISA_ENV takes; native: all the CPU has
BASELINE = ("avx2", "fma", "f16c")  # what the native kernels need


@functools.cache
def cpu_flags() -> frozenset[str]:
    """The CPU's instruction-set flags (empty where /proc/cpuinfo cannot be read)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def forced_isa() -> str:
    """RADIXRT_CPU_ISA's value, "native" when unset; ValueError naming the allowed values."""
    isa = os.environ.get(ISA_ENV, "") or "native"
    if isa not in ISAS:
        raise ValueError(f"{ISA_ENV} must be one of {list(ISAS)}, got {isa!r}")
    return isa


# What RADIXRT_CPU_ISA=avx2 turns off on top of -march=native: AVX-512 and AMX (no CPU has
# AMX without AVX-512; left on, the kernels would take this CPU's bf16 units for granted and
# oneDNN, held to AVX2, would emulate them: prefill 3.9x slower on an AMX Xeon). AVX-VNNI
# stays: laptops with AVX2 and no AVX-512 have had it since 2021.
AVX2_CFLAGS = ["-mno-avx512f", "-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16"]


def isa_cflags() -> list[str]:
    """Compiler flags for the chosen instruction sets on top of -march=native."""
    return list(AVX2_CFLAGS) if forced_isa() == "avx2" else []


def missing_baseline() -> list[str]:
    """The flags of BASELINE this CPU lacks (none where its flags cannot be read: the
    compiler's own -march=native then decides)."""
    flags = cpu_flags()
    return [f for f in BASELINE if flags and f not in flags]


def cpu_has_bf16() -> bool:
    """AVX-512 BF16 (or AMX) makes bf16 matmuls about twice as fast as fp32 on the CPU."""
    if forced_isa() == "avx2":
        return False
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())
