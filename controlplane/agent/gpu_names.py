"""NVML product names to GPU classes: `NVIDIA H100 80GB HBM3` -> `H100-80GB`.

A class is the family and its memory, what placement matches on. The memory is the one in the
name when there is one, else the family's usual size, else NVML's total rounded to GB.
"""

from __future__ import annotations

import re

# Longest first, so that "H100" is not taken for "H10" and "L40S" not for "L40".
FAMILIES = [
    ("GB300", r"GB300"),
    ("GB200", r"GB200"),
    ("GH200", r"GH200"),
    ("B300", r"B300"),
    ("B200", r"B200"),
    ("H200", r"H200"),
    ("H100", r"H100"),
    ("H800", r"H800"),
    ("H20", r"H20\b"),
    ("A100", r"A100"),
    ("A800", r"A800"),
    ("A40", r"A40\b"),
    ("A30", r"A30\b"),
    ("A10G", r"A10G"),
    ("A10", r"A10\b"),
    ("A16", r"A16\b"),
    ("L40S", r"L40S"),
    ("L40", r"L40\b"),
    ("L20", r"L20\b"),
    ("L4", r"L4\b"),
    ("RTX6000-ADA", r"RTX 6000 Ada"),
    ("RTXPRO6000", r"RTX PRO 6000"),
    ("V100", r"V100"),
    ("T4", r"T4\b"),
]
USUAL_MEMORY_GB = {
    "GB300": 288,
    "GB200": 186,
    "GH200": 96,
    "B300": 288,
    "B200": 180,
    "H200": 141,
    "H100": 80,
    "H800": 80,
    "H20": 96,
    "A40": 48,
    "A30": 24,
    "A10G": 24,
    "A10": 24,
    "A16": 16,
    "L40S": 48,
    "L40": 48,
    "L20": 48,
    "L4": 24,
    "RTX6000-ADA": 48,
    "RTXPRO6000": 96,
    "T4": 16,
}
SUFFIXES = [("NVL", r"\bNVL\b"), ("PCIE", r"\bPCIe\b")]
VARIANT_MEMORY_GB = {("H100", "NVL"): 94}


def gpu_class(name: str | bytes, memory_mib: int = 0) -> str:
    if isinstance(name, bytes):
        name = name.decode(errors="replace")
    text = name.strip()
    family = next((fam for fam, pattern in FAMILIES if re.search(pattern, text)), None)
    stated = re.search(r"(\d+)\s*GB", text)
    if stated:
        memory_gb = int(stated.group(1))
    elif (family, "NVL") in VARIANT_MEMORY_GB and re.search(r"\bNVL\b", text):
        memory_gb = VARIANT_MEMORY_GB[(family, "NVL")]
    elif family in USUAL_MEMORY_GB:
        memory_gb = USUAL_MEMORY_GB[family]
    else:
        memory_gb = round(memory_mib / 1024) if memory_mib else 0
    if family is None:
        # Unknown part: keep its own name, tidied, so that it still groups with its twins.
        family = re.sub(r"[^A-Za-z0-9]+", "-", re.sub(r"^NVIDIA\s+", "", text)).strip("-")
        family = re.sub(r"-?\d+\s*GB", "", family) or "GPU"
    suffix = "".join(f"-{label}" for label, pattern in SUFFIXES if re.search(pattern, text, re.I))
    return f"{family}-{memory_gb}GB{suffix}" if memory_gb else f"{family}{suffix}"
