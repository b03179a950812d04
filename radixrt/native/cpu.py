"""What this CPU can do, read from /proc/cpuinfo (stdlib only)."""

from __future__ import annotations


def cpu_has_bf16() -> bool:
    """AVX-512 BF16 (or AMX) makes bf16 matmuls about twice as fast as fp32 on the CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = f.read()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags
