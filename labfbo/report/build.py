"""Build a site's campaign report: gather what the journal and the model say, draw, render."""

from __future__ import annotations

import base64
import datetime as _dt
import math
import multiprocessing
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from jinja2 import Environment, PackageLoader, select_autoescape

from labfbo.core.exceptions import LabFBOError
from labfbo.core.release import Release
from labfbo.privacy.report import report as privacy_rows
from labfbo.report.campaign import Campaign, decode_points
from labfbo.report.disclosure import disclosure
from labfbo.report.insight import Belief, Dependence, SiteModel
from labfbo.site.compute import COMPUTE

TOP_DEPENDENCE = 3  # partial-dependence panels for the most important parameters


@dataclass
class Report:
    """A written report: the HTML page and each plot's PNG."""

    html: Path
    plots: dict[str, Path] = field(default_factory=dict)


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        if not math.isfinite(v):
            return "∞" if v > 0 else ("−∞" if v < 0 else "n/a")
        return f"{v:.4g}"
    return str(v)


def _budget(campaign: Campaign) -> dict[str, Any] | None:
    """The campaign's privacy budget (``DP(epsilon=...)`` in the journal's options) and what was withheld."""
    dp = (campaign.header.options or {}).get("privacy") or {}
    if not isinstance(dp, dict) or dp.get("epsilon") is None:
        return None
    held = campaign.state.withheld
    return {"epsilon": dp["epsilon"], "calibrated": dp.get("noise_multiplier") is None, "withheld": len(held),
            "first_round": held[0].round if held else None}


def _privacy(campaign: Campaign) -> tuple[list[dict[str, Any]], list[float]]:
    """Per-round DP rows (releases, mechanism, noise multiplier, cumulative epsilon) and the
    cumulative epsilon after each release (for the traffic plot; the page's statements are
    :mod:`labfbo.report.disclosure`'s)."""
    releases = [r for r in campaign.state.releases if isinstance(r, Release)]
    rows = privacy_rows(releases)
    by_round: dict[int, dict[str, Any]] = {}
    for row in rows:
        r = by_round.setdefault(row["round"], {"round": row["round"], "releases": 0, "messages": set(),
                                               "mechanism": row["mechanism"], "noise": row["noise_multiplier"],
                                               "secure": row["secure_aggregation"]})
        r["releases"] += 1
        r["messages"].add(row["message"])
        r["epsilon"] = row["epsilon"]
        r["delta"] = row["delta"]
    out = [{**r, "messages": ", ".join(sorted(r["messages"]))} for r in by_round.values()]
    return out, [row["epsilon"] for row in rows]


def _traffic(campaign: Campaign) -> dict[str, Any]:
    entries = campaign.state.traffic
    sent = [e for e in entries if e.direction == "sent"]
    got = [e for e in entries if e.direction == "received"]
    return {"sent": len(sent), "received": len(got), "bytes_sent": sum(e.nbytes for e in sent),
            "bytes_received": sum(e.nbytes for e in got)}


def _guidance(campaign: Campaign) -> list[dict[str, Any]]:
    rows = []
    for g in campaign.state.guidance:
        points = None
        for key in ("points", "consensus", "point"):
            points = decode_points(campaign.space, g.summary.get(key)) if key in g.summary else None
            if points:
                break
        shapes = {k: v["shape"] for k, v in g.summary.items() if isinstance(v, dict) and "shape" in v}
        scalars = {k: v for k, v in g.summary.items() if isinstance(v, (int, float, str, bool)) and k != "round"}
        rows.append({"round": g.round, "kind": g.kind, "nbytes": g.nbytes, "points": points, "shapes": shapes,
                     "scalars": scalars})
    return rows


Insights = tuple[Belief | None, dict[str, float] | None, list[Dependence], str | None]


def _insights(campaign: Campaign) -> Insights:
    """The model's predicted best, the importance shares, the top partial dependences, or why not."""
    try:
        with COMPUTE:  # the process's GP work: torch's global RNG and settings are shared
            model = SiteModel(campaign)
            shares = model.importance()
            top = [n for n in sorted(shares, key=lambda n: -shares[n]) if shares[n] > 0][:TOP_DEPENDENCE]
            return model.belief(), shares, [model.dependence(n) for n in top], None
    except LabFBOError as exc:
        return None, None, [], str(exc)


def _insights_child(campaign: Campaign, conn: Any) -> None:
    try:
        conn.send(_insights(campaign))
    except BaseException as exc:  # noqa: BLE001 - the parent raises it
        conn.send(exc)
    finally:
        conn.close()


def _transfer(campaign: Campaign) -> dict[str, Any] | None:
    """What the partners' information was worth to this lab, as its protocol estimated it at each
    proposal (:mod:`labfbo.models.transfer`): the latest estimate and the last rounds'."""
    marks = campaign.state.transfer
    if not marks:
        return None
    rounds = [{"round": r, "gain": e.gain, "alone": e.alone, "shared": e.shared, "n": e.n, "scale": e.scale,
               "agreement": e.agreement, "agreement_se": e.agreement_se} for r, e in marks[-12:]]
    gains = [e.gain for _, e in marks]
    return {"last": rounds[-1], "rounds": rounds, "mean": sum(gains) / len(gains), "count": len(gains)}


def _start_insights(campaign: Campaign, fork: bool) -> Callable[[], Insights]:
    """Start the model's work; returns the call that waits for it. ``fork``: in a forked process
    (the other core), while this one draws — only for a single-threaded process (the command
    line): a fork copies the locks other threads may hold."""
    if not fork or threading.active_count() > 1 or "fork" not in multiprocessing.get_all_start_methods():
        result = _insights(campaign)
        return lambda: result
    ctx = multiprocessing.get_context("fork")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_insights_child, args=(campaign, sender), daemon=True)
    proc.start()
    sender.close()

    def wait() -> Insights:
        try:
            out = receiver.recv()
        except EOFError:
            raise LabFBOError(f"the report's model process ended without a result (exit code {proc.exitcode})") \
                from None
        finally:
            receiver.close()
            proc.join()
        if isinstance(out, BaseException):
            raise out
        return out  # type: ignore[no-any-return]

    return wait


def build(campaign: Campaign, path: str | os.PathLike[str], objective_label: str | None = None,
          fork: bool = False) -> Report:
    """Write ``path`` (HTML, plots embedded) and its plots as PNG beside it (``<stem>_plots/``);
    ``fork``: the command line's, see :func:`_start_insights`."""
    path = Path(path)
    if path.suffix.lower() not in (".html", ".htm"):
        raise LabFBOError(f"a report is an .html file, got {str(path)!r}")
    ylabel = objective_label or campaign.objective_name
    insights = _start_insights(campaign, fork)
    import labfbo.report.plots as plots  # matplotlib loads while a forked model fits

    # a lab's names are text, never math: "$" in a parameter or choice name is a dollar sign
    with plots.plt.rc_context({"text.parse_math": False}):
        figures: dict[str, bytes | None] = {"progress": plots.png(plots.progress_figure(campaign, ylabel)),
                                            "pareto": plots.png(plots.pareto_figure(campaign))}
        dp_rows, epsilons = _privacy(campaign)
        figures["traffic"] = plots.png(plots.traffic_figure(campaign, epsilons))
        belief, shares, deps, model_note = insights()
        if shares is not None:
            figures["importance"] = plots.png(plots.importance_figure(campaign, shares))
            figures["dependence"] = plots.png(plots.dependence_figure(campaign, deps, ylabel)) if deps else None

    plot_dir = path.parent / f"{path.stem}_plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    images: dict[str, str] = {}
    for name, png in figures.items():
        if png is None:
            continue
        (plot_dir / f"{name}.png").write_bytes(png)
        written[name] = plot_dir / f"{name}.png"
        images[name] = "data:image/png;base64," + base64.b64encode(png).decode("ascii")

    exps = campaign.experiments
    best = campaign.best()
    env = Environment(loader=PackageLoader("labfbo.report", "templates"), autoescape=select_autoescape(["html"]))
    env.filters["fmt"] = _fmt
    env.filters["bytes"] = plots.human_bytes
    html = env.get_template("report.html").render(
        c=campaign, h=campaign.header, ylabel=ylabel, images=images, best=best, belief=belief,
        model_note=model_note, shares=shares and sorted(shares.items(), key=lambda kv: -kv[1]),
        labels={n: plots.param_label(campaign, n) for n in campaign.space.names},
        counts={"all": len(exps), "complete": sum(e.state == "complete" for e in exps),
                "failed": sum(e.state == "failed" for e in exps), "pending": sum(e.state == "pending" for e in exps),
                "retracted": sum(e.state == "retracted" for e in exps),
                "infeasible": sum(e.state == "complete" and not e.feasible for e in exps),
                "initial": sum(e.initial for e in exps), "historical": sum(e.source == "historical" for e in exps)},
        traffic=_traffic(campaign), dp_rows=dp_rows, guidance=_guidance(campaign), privacy=disclosure(campaign),
        budget=_budget(campaign), transfer=_transfer(campaign),
        outcome_names=campaign.spec.names if campaign.spec is not None else [],
        generated=_dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(html, encoding="utf-8")
    os.replace(tmp, path)
    return Report(html=path, plots=written)
