"""GPU type catalog (package data gpus.toml): memory, FP32/BF16 TFLOPS, default price.

Pure. Prices follow JABAS's reporting rule: V100 = 3.06 $/GPU-hour, other types scaled by
FP32 TFLOPS (docs/formulas.md, section 7). Unknown names raise ConfigError listing known ones.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from typing import Any

from hpc_jabas.errors import ConfigError

V100_PRICE = 3.06
REFERENCE = "v100"


@dataclass(frozen=True)
class GpuType:
    key: str
    name: str
    memory_gb: float
    fp32_tflops: float
    bf16_tflops: float
    price_per_hour: float

    @property
    def relative_speed(self) -> float:
        """FP32 throughput relative to a V100 (the catalog's reference)."""
        return self.fp32_tflops / float(_raw()[REFERENCE]["fp32_tflops"])


@lru_cache(maxsize=1)
def _raw() -> dict[str, Any]:
    text = resources.files("hpc_jabas").joinpath("data/gpus.toml").read_text()
    return tomllib.loads(text)


@lru_cache(maxsize=1)
def _aliases() -> dict[str, str]:
    out: dict[str, str] = {}
    for key, d in _raw().items():
        out[key] = key
        for a in d.get("aliases", []):
            out[a.lower()] = key
    return out


def known() -> list[str]:
    return sorted(_raw())


def normalize(name: str) -> str:
    """Catalog key for a type name or alias ('RTX_2060' -> 'rtx2060')."""
    k = str(name).strip().lower().replace(" ", "-")
    al = _aliases()
    if k in al:
        return al[k]
    k2 = k.replace("-", "").replace("_", "")
    for a, key in al.items():
        if a.replace("-", "").replace("_", "") == k2:
            return key
    raise ConfigError(f"unknown GPU type {name!r}; known types: {', '.join(known())}")


def get(name: str, prices: dict[str, float] | None = None) -> GpuType:
    key = normalize(name)
    d = _raw()[key]
    ref = _raw()[REFERENCE]["fp32_tflops"]
    price = V100_PRICE * d["fp32_tflops"] / ref
    if prices:
        for pk, pv in prices.items():
            if normalize(pk) == key:
                if not (isinstance(pv, (int, float)) and pv >= 0):
                    raise ConfigError(f"price for {pk!r} is {pv!r}; a price must be a number >= 0")
                price = float(pv)
    return GpuType(key, d["name"], float(d["memory_gb"]), float(d["fp32_tflops"]),
                   float(d["bf16_tflops"]), round(price, 4))
