"""Peak memory bandwidth of NVIDIA devices, by the name NVML gives them (``hw.name``).

The figures are the vendors' datasheet peaks (HBM or GDDR, the SXM or PCIe variant the name says);
what a kernel reaches is lower (STREAM-like copies get 80-90 % of them). They are the denominator of
the MBU estimate (docs/advise.md); a device not in this table is named by the user instead
(``otel-ebpf advise --peak-bandwidth``).
"""

from __future__ import annotations

import re

GB = 1e9

# Most specific first: "H100 PCIe" before "H100", "A100-SXM4-40GB" before "A100".
_PEAKS_GB_S: tuple[tuple[str, float], ...] = (
    (r"\bB200\b", 8000),
    (r"\bGH200\b.*\b144\s?GB|\bGH200\b.*HBM3e", 4900),
    (r"\bGH200\b", 4000),
    (r"\bH200\b", 4800),
    (r"\bH100\b.*\bNVL\b", 3900),
    (r"\bH100\b.*\bPCIe\b", 2000),
    (r"\bH100\b", 3350),  # SXM5 80 GB HBM3
    (r"\bH800\b.*\bPCIe\b", 2000),
    (r"\bH800\b", 3350),
    (r"\bA100\b.*\b40\s?GB\b", 1555),
    (r"\bA100\b.*\bPCIe\b", 1935),  # 80 GB PCIe
    (r"\bA100\b", 2039),  # SXM4 80 GB
    (r"\bA800\b", 2039),
    (r"\bL40S?\b", 864),
    (r"\bL4\b", 300),
    (r"\bA10G\b", 600),
    (r"\bA10\b", 600),
    (r"\bA30\b", 933),
    (r"\bT4\b", 320),
    (r"\bV100\b.*\b32\s?GB\b|\bV100S\b", 1134),
    (r"\bV100\b", 900),
    (r"\bRTX\s?6000 Ada\b", 960),
    (r"\bRTX\s?4090\b", 1008),
    (r"\bRTX\s?3090\b", 936),
)


def peak_bandwidth(device_name: str) -> float | None:
    """Bytes per second at the device's datasheet peak, or None for a device not in the table."""
    for pattern, gb_s in _PEAKS_GB_S:
        if re.search(pattern, device_name, re.IGNORECASE):
            return gb_s * GB
    return None
