r"""``gradient``'s compact wire (``wire="compact"``): 8-bit scores up, 8-bit particle changes down.

Lossless, a ``score`` and a ``particles_request`` are each :math:`8KP` bytes (float64);
with the defaults that is ~99 MB per site each way in the 500-step warm-up. The compact
wire sends about an eighth:

* **Scores up.** A site's :math:`K \times P` scores are cut into blocks of
  :data:`BLOCK` values; each block is sent as int8 codes with one float32 scale
  :math:`s_b = \max_{j \in b} |A_j|`, and the coordinator reads :math:`\hat A_j = c_j s_b / 127`.
  The codes are *stochastically rounded*, :math:`c_j = \lfloor 127 A_j / s_b + u_j \rfloor`
  with :math:`u_j \sim U[0, 1)`, so :math:`E[\hat A_j] = A_j`: the sum over sites, and so
  the SVGD step, is unbiased, with an added variance of at most :math:`(s_b/127)^2/4` per
  value. The draws come from the site's generator for ``(seed, site, round,
  "wire/<step>")``: the same seed sends the same codes on every transport.
* **Particles down.** The first exchange of a round sends the particles as they are
  (float64). Each later one sends :class:`ParticlesDelta`: the change since the particles
  the sites *reconstructed* at the previous step, quantized the same way. Coordinator and
  sites apply the same codes to the same reference, so they hold bit-identical
  reconstructions and the error does not accumulate: a site scores particles within half a
  quantization step of a block's largest change of the coordinator's. A delta names its
  base (step and a SHA-256 of the base particles); a site that does not hold that base (it
  crashed, timed out, or holds a failed attempt's particles of the same round) abstains
  once, and the coordinator sends it the next step's reconstruction in full (the others
  keep their deltas); if nobody could score, the step is sent again in full to everyone.

DP is unaffected: quantizing noised scores is post-processing. The compact wire does not
combine with secure aggregation (masked sums need the exact values).
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import numpy as np
from pydantic import model_validator

from labfbo.core.messages import Array, Message, register

BLOCK = 64
"""Values per quantization block (one float32 scale each: 1/16 of a byte per value)."""
MISSED = "compact wire: missed the particles this step changes"


def quantize(x: np.ndarray, gen: np.random.Generator) -> tuple[Array, Array]:
    """``x`` as int8 codes (its shape) and one float32 scale per block of :data:`BLOCK`
    values (flattened), stochastically rounded: ``dequantize`` of the result is unbiased."""
    flat = np.asarray(x, dtype=np.float64).ravel()
    pad = (-flat.size) % BLOCK
    blocks = np.concatenate([flat, np.zeros(pad)]).reshape(-1, BLOCK)
    scale = np.abs(blocks).max(axis=1).astype(np.float32)  # the code reads the float32 scale
    s = scale.astype(np.float64)[:, None]
    v = np.divide(127.0 * blocks, s, out=np.zeros_like(blocks), where=s > 0)
    codes = np.clip(np.floor(v + gen.random(v.shape)), -127, 127).astype(np.int8)
    return Array.of(codes.ravel()[:flat.size].reshape(np.shape(x)), dtype="int8"), Array.of(scale, dtype="float32")


def check_codes(codes: Array, scale: Array) -> None:
    """Refuse codes that are not int8 or do not match their float32 scales (one per block)."""
    blocks = -(-codes.n_scalars // BLOCK)
    if codes.dtype != "int8" or scale.dtype != "float32" or tuple(scale.shape) != (blocks,):
        raise ValueError(f"compact codes must be int8 with {blocks} float32 scales, got {codes.dtype} codes and "
                         f"{scale.dtype} scales of shape {tuple(scale.shape)}")


def dequantize(codes: Array, scale: Array) -> np.ndarray:
    """The float64 values of :func:`quantize`'s codes (the same bits on every machine)."""
    c = codes.numpy().astype(np.float64)
    flat = c.ravel()
    s = scale.numpy().astype(np.float64)
    if s.shape != (-(-flat.size // BLOCK),):
        raise ValueError(f"{flat.size} codes need {-(-flat.size // BLOCK)} scales, got {s.shape}")
    return (flat * np.repeat(s, BLOCK)[:flat.size] / 127.0).reshape(c.shape)


def fingerprint(particles: np.ndarray) -> str:
    """32 hex digits of the SHA-256 of float64 particles (little-endian): names a delta's base."""
    return hashlib.sha256(np.ascontiguousarray(particles, dtype="<f8").tobytes()).hexdigest()[:32]


@register
class ParticlesDelta(Message):
    """Coordinator -> site (``wire="compact"``): this step's particles as the quantized change
    from those the sites reconstructed at step ``base_step`` of this round (``base`` is their
    :func:`fingerprint`); answer with your scores."""

    kind: Literal["particles_delta"] = "particles_delta"
    step: int
    base_step: int
    base: str
    codes: Array
    scale: Array

    @model_validator(mode="after")
    def _codes_fit_their_scales(self) -> "ParticlesDelta":
        check_codes(self.codes, self.scale)
        return self


def without_unset_scale(out: Any, scale: Any) -> Any:
    """A lossless message's JSON omits its unset ``scale`` (byte for byte as before)."""
    if scale is None and isinstance(out, dict):
        out.pop("scale", None)
    return out


class SiteWire:
    """A site's end of the compact wire: the particles it reconstructed at its last exchange."""

    def __init__(self) -> None:
        self.ref: tuple[int, int, np.ndarray, str | None] | None = None  # (round, step, particles, base used)

    def particles(self, request: Message, round: int) -> np.ndarray | None:
        """The request's particles (a full request, or a delta on the last ones); None if this
        site does not hold the particles the delta changes."""
        if isinstance(request, ParticlesDelta):
            ref = self.ref
            if ref is not None and ref[:2] == (round, request.step) and ref[3] == request.base:
                return ref[2]  # the same request again (an answer lost on the way, retried)
            if ref is None or ref[:2] != (round, request.base_step) or fingerprint(ref[2]) != request.base:
                self.ref = None
                return None
            theta, base = ref[2] + dequantize(request.codes, request.scale), request.base
        else:
            theta, base = request.particles.numpy(), None  # type: ignore[attr-defined]
        self.ref = (round, request.step, theta, base)  # type: ignore[attr-defined]
        return theta


class CoordinatorWire:
    """The coordinator's end: what the sites reconstructed, and which sites lost the thread."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.ref: tuple[int, np.ndarray] | None = None  # (step, the sites' particles)
        self.behind: set[str] = set()  # sites that said they miss the base of the last delta

    def reset(self) -> None:
        """Send the next step in full to everyone (a new round, or nobody could score)."""
        self.ref = None
        self.behind.clear()

    def request(self, particles: np.ndarray, step: int,
                round: int) -> tuple[ParticlesDelta | None, Array | None, set[str]]:
        """``(delta, full, sites)``: the delta for the sites that hold the base; ``full``, the
        particles as the sites will hold them, for ``sites`` (everyone when ``delta`` is None)."""
        from labfbo.core.seeding import rng

        behind, self.behind = self.behind, set()
        if self.ref is None:
            full = Array.of(particles)
            self.ref = (step, full.numpy())
            return None, full, behind
        base, ref = self.ref
        codes, scale = quantize(particles - ref, rng(self.seed, 0, round, f"wire-down/{step}"))
        new = ref + dequantize(codes, scale)
        self.ref = (step, new)
        delta = ParticlesDelta(step=step, base_step=base, base=fingerprint(ref), codes=codes, scale=scale)
        return delta, (Array.of(new) if behind else None), behind
