"""The `compute` block: backend, accelerators ("GPU:1", "H100:8", "L4", "A100-80GB:2", "CPU"), spot, region."""
from __future__ import annotations

import re
from dataclasses import dataclass

from studio.errors import Finding
from training.keys import BOOL, TEXT, Key, check_block, normalise_block

ACCELERATORS = re.compile(r"^(?P<type>[A-Za-z][A-Za-z0-9-]*)(?::(?P<count>\d+))?$")
COMPUTE_KEYS = {
    "backend": Key("choice", choices=("local", "dstack", "modal")),
    "accelerators": Key("str"),
    "spot": BOOL,
    "region": TEXT,
}
# The longest GPU spec (A100-80GB:8) and cloud region names are far shorter; this bounds what is stored.
TEXT_LIMITS = {"accelerators": 64, "region": 100}

# GPU architecture by type name (upper-case). Precision support follows the architecture.
ARCHITECTURES: dict[str, str] = {
    **dict.fromkeys(["B100", "B200", "GB200", "B300", "GB300", "RTX5090", "RTX-5090", "RTX-PRO-6000", "RTXPRO6000"], "blackwell"),
    **dict.fromkeys(["H100", "H100-80GB", "H100-NVL", "H200", "GH200", "H800", "H20"], "hopper"),
    **dict.fromkeys(["L4", "L40", "L40S", "RTX4090", "RTX-4090", "RTX6000ADA", "RTX-6000-ADA", "RTX4000ADA"], "ada"),
    **dict.fromkeys(["A100", "A100-40GB", "A100-80GB", "A10", "A10G", "A30", "A40", "A6000", "RTXA6000", "RTX3090", "A5000", "A4000"], "ampere"),
    **dict.fromkeys(["T4", "RTX2080", "RTX8000"], "turing"),
    **dict.fromkeys(["V100", "V100-32GB"], "volta"),
    **dict.fromkeys(["P100", "P40", "P4"], "pascal"),
}
# GiB of memory on one card, for "does the teacher fit" warnings.
GPU_MEMORY_GIB: dict[str, int] = {
    "B200": 180, "GB200": 186, "B100": 180, "H200": 141, "GH200": 96, "H100": 80, "H100-80GB": 80, "H100-NVL": 94, "H800": 80,
    "L4": 24, "L40": 48, "L40S": 48, "RTX4090": 24, "A100": 40, "A100-40GB": 40, "A100-80GB": 80, "A10": 24, "A10G": 24,
    "A40": 48, "A6000": 48, "T4": 16, "V100": 16, "V100-32GB": 32, "RTX5090": 32,
}
PRECISION_ARCHITECTURES = {"fp8": ("ada", "hopper", "blackwell"), "nvfp4": ("blackwell",)}
PRECISION_EXAMPLES = {"fp8": "H100", "nvfp4": "B200"}


@dataclass(frozen=True)
class Accelerators:
    gpu_type: str | None  # None for a generic "GPU:n" (any type) and for the CPU
    count: int  # GPUs; 0 for the CPU

    @property
    def is_cpu(self) -> bool:
        return self.count == 0

    @property
    def architecture(self) -> str | None:
        return ARCHITECTURES.get(self.gpu_type or "")


def parse_accelerators(value: str) -> Accelerators | None:
    match = ACCELERATORS.match((value or "").strip())
    if not match:
        return None
    gpu_type, count = match["type"].upper(), match["count"]
    if gpu_type == "CPU":
        return Accelerators(None, 0) if count is None else None
    n = int(count) if count is not None else 1
    if n < 1:
        return None
    return Accelerators(None if gpu_type == "GPU" else gpu_type, n)


def check_compute(compute: dict) -> list[Finding]:
    """Types (400): the keys, the backend name and the accelerators string."""
    findings = check_block("compute", compute, COMPUTE_KEYS)
    for key, longest in TEXT_LIMITS.items():
        if isinstance(compute.get(key), str) and len(compute[key]) > longest:
            findings.append(Finding(f"compute.{key}", f"at most {longest} characters; this one has {len(compute[key])}"))
    accelerators = compute.get("accelerators")
    if findings:
        return findings
    if isinstance(accelerators, str) and accelerators.strip() and parse_accelerators(accelerators) is None:
        findings.append(Finding("compute.accelerators", f'"{accelerators}" is not an accelerator spec: use GPU:1, H100:8, L4, A100-80GB:2, or CPU (local backend)'))
    return findings


def normalise_compute(compute: dict) -> dict:
    compute = normalise_block({"backend": "local", "spot": False, "region": None, **compute}, COMPUTE_KEYS)
    if not compute.get("accelerators"):
        compute["accelerators"] = "CPU" if compute["backend"] == "local" else "GPU:1"
    return compute


def accelerators_of(compute: dict) -> Accelerators:
    return parse_accelerators(compute.get("accelerators") or "CPU") or Accelerators(None, 0)


def precision_findings(precision: str | None, accel: Accelerators) -> list[Finding]:
    needs = PRECISION_ARCHITECTURES.get((precision or "").lower())
    if not needs or precision is None:  # a None precision never has needs ("" is no key): this only tells mypy
        return []
    label = precision.upper()
    names = [a.capitalize() for a in needs]
    wanted = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
    article = "an" if wanted[0] in "AEIOU" else "a"
    example = PRECISION_EXAMPLES[precision.lower()]  # a card it runs on (NVFP4's advice named the H100, a Hopper)
    if accel.is_cpu:
        return [Finding("config.precision", f"{label} needs {article} {wanted} GPU, and this run asks for the CPU: use bf16, or ask for e.g. {example}:1")]
    if accel.gpu_type is None:
        return [Finding("compute.accelerators", f"{label} needs {article} {wanted} GPU: ask for the GPU type (e.g. {example}:{accel.count}) instead of a generic GPU:{accel.count}")]
    if accel.architecture not in needs:
        arch = accel.architecture.capitalize() if accel.architecture else "an unknown architecture"
        return [Finding("config.precision", f"{label} needs {article} {wanted} GPU; {accel.gpu_type} is {arch}: use bf16 or pick e.g. {example}")]
    return []


def trained_precision(config: dict, compute: dict) -> str:
    """What a run's weights train in, by the engine's rule (modeling.pick_device): fp32 on the CPU; on a
    GPU the configured precision, bf16 by default."""
    if accelerators_of(compute).is_cpu:
        return "fp32"
    return config.get("precision") or "bf16"
