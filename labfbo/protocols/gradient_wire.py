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
  quantization step of a block's largest change of the coordinator's. A site that missed
  the previous step (it crashed, or timed out) abstains once, and the coordinator sends
  the next step in full.

DP is unaffected: quantizing noised scores is post-processing. The compact wire does not
combine with secure aggregation (masked sums need the exact values).
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

from labfbo.messages import Array, Message, register

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


def dequantize(codes: Array, scale: Array) -> np.ndarray:
    """The float64 values of :func:`quantize`'s codes (the same bits on every machine)."""
    c = codes.numpy().astype(np.float64)
    flat = c.ravel()
    s = scale.numpy().astype(np.float64)
    if s.shape != (-(-flat.size // BLOCK),):
        raise ValueError(f"{flat.size} codes need {-(-flat.size // BLOCK)} scales, got {s.shape}")
    return (flat * np.repeat(s, BLOCK)[:flat.size] / 127.0).reshape(c.shape)


@register
class ParticlesDelta(Message):
    """Coordinator -> site (``wire="compact"``): this step's particles as the quantized change
    from those the sites reconstructed at step ``base_step`` of this round; answer with your scores."""

    kind: Literal["particles_delta"] = "particles_delta"
    step: int
    base_step: int
    codes: Array
    scale: Array


def without_unset_scale(out: Any, scale: Any) -> Any:
    """A lossless message's JSON omits its unset ``scale`` (byte for byte as before)."""
    if scale is None and isinstance(out, dict):
        out.pop("scale", None)
    return out


class SiteWire:
    """A site's end of the compact wire: the particles it reconstructed at its last exchange."""

    def __init__(self) -> None:
        self.ref: tuple[int, int, np.ndarray] | None = None  # (round, step, particles)

    def particles(self, request: Message, round: int) -> np.ndarray | None:
        """The request's particles (a full request, or a delta on the last ones); None if this
        site does not hold the particles the delta changes."""
        if isinstance(request, ParticlesDelta):
            if self.ref is not None and self.ref[:2] == (round, request.step):
                return self.ref[2]  # the same request again (an answer lost on the way, retried)
            if self.ref is None or self.ref[:2] != (round, request.base_step):
                self.ref = None
                return None
            theta = self.ref[2] + dequantize(request.codes, request.scale)
        else:
            theta = request.particles.numpy()  # type: ignore[attr-defined]
        self.ref = (round, request.step, theta)  # type: ignore[attr-defined]
        return theta


class CoordinatorWire:
    """The coordinator's end: what the sites reconstructed, and whether the next step is sent in full."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.ref: tuple[int, np.ndarray] | None = None  # (step, the sites' particles)

    def reset(self) -> None:
        """Send the next step in full (a new round, or a site lost the thread)."""
        self.ref = None

    def request(self, particles: np.ndarray, step: int, round: int) -> tuple[Message | None, Array | None]:
        """``(ParticlesDelta, None)`` on a reference, else ``(None, particles as sent)`` for the
        caller's full request; either way the reference becomes what the sites will hold."""
        from labfbo.seeding import rng

        if self.ref is None:
            full = Array.of(particles)
            self.ref = (step, full.numpy())
            return None, full
        base, ref = self.ref
        codes, scale = quantize(particles - ref, rng(self.seed, 0, round, f"wire-down/{step}"))
        self.ref = (step, ref + dequantize(codes, scale))
        return ParticlesDelta(step=step, base_step=base, codes=codes, scale=scale), None
