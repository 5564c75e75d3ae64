"""What a received answer released, as its protocol's site side declares it.

The coordinator's :class:`~labfbo.privacy.accounts.PrivacyLedger` accounts each answer by the
release this module reads: the protocol's own declaration (:meth:`SiteLogic.release`, the code a
site journals its release with) under the DP settings the answer states.
"""

from __future__ import annotations

from typing import Any, Callable

from labfbo.core.dp import DP
from labfbo.core.messages import Abstain, Message
from labfbo.core.release import Release
from labfbo.privacy.accounts import Undeclared
from labfbo.protocols.base import SiteContext


class ReleaseReader:
    """What an answer releases, declared by the protocol's site side under the DP settings the
    answer states (one site logic per ``(noise multiplier, clip)``, built once)."""

    def __init__(self, protocol_cls: Any, options: Any, space_of: Callable[[], Any], delta: float) -> None:
        self.protocol_cls, self.options, self.space_of, self.delta = protocol_cls, options, space_of, delta
        self.logic: dict[tuple[Any, Any], Any] = {}

    def _logic(self, noise: float | None, clip: float | None) -> Any:
        key = (noise, clip)
        if key not in self.logic:
            opts = self.options
            if self.protocol_cls.supports_privacy():
                base = self.protocol_cls.from_options(opts).privacy
                dp = None if noise is None else DP(clip=clip if clip is not None else (base.clip if base else 1.0),
                                                   noise_multiplier=noise, delta=self.delta)
                opts = opts.model_copy(update={"privacy": dp})
            elif noise is not None:
                raise Undeclared(f"protocol {self.protocol_cls.name!r} has no privacy option, the answer states a "
                                 "noise multiplier")
            self.logic[key] = self.protocol_cls.site_logic(self.space_of(), opts, SiteContext(site="coordinator"))
        return self.logic[key]

    def release(self, msg: Message) -> Release | None:
        """``msg``'s release (None: it carries nothing computed from data, e.g. key material or an
        ``Abstain``); :class:`Undeclared` when the declaration cannot run here."""
        return received_release(msg, self._logic)


def received_release(msg: Message, logic_for: Callable[[float | None, float | None], Any]) -> Release | None:
    """The release a received answer makes, as the protocol's site side declares it
    (:meth:`labfbo.protocols.SiteLogic.release`) from the answer's kind, round, step and DP
    fields: ``logic_for(noise multiplier, clip)`` is that site side under those settings."""
    if isinstance(msg, Abstain):
        return None
    noise, clip = getattr(msg, "dp_noise_multiplier", None), getattr(msg, "dp_clip", None)
    try:
        # the site's own declaration of what it sent (e.g. a vote sealed again repeats one: no new release)
        return logic_for(noise, clip).release(msg)
    except Undeclared:
        raise
    except Exception as exc:  # noqa: BLE001 - the protocol's own reason
        raise Undeclared(f"the {msg.kind!r} declaration cannot run here: {exc}") from None
