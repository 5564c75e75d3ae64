"""``labfbo report JOURNAL [-o report.html]``: a site's campaign report from its journal."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def _cmd_report(args: argparse.Namespace) -> int:
    from labfbo.report import write_report

    journal = Path(args.journal)
    out = args.output or str(journal.with_name(journal.stem + "-report.html"))
    # a single-threaded process: the model fits in a forked process on the other core while this one draws
    rep = write_report(args.journal, out, objective_label=args.objective_label, fork=True)
    print(f"report: {rep.html}")
    print(f"plots:  {', '.join(str(p) for p in rep.plots.values())}")
    return 0


def add_parser(sub: Any) -> None:
    rp = sub.add_parser("report", help="a site's campaign report (HTML + PNG) from its journal alone")
    rp.add_argument("journal", help="the site's journal (its storage= file); it is only read")
    rp.add_argument("-o", "--output", help="the HTML file (default: JOURNAL's name + -report.html)")
    rp.add_argument("--objective-label", help="the objective's label on axes, e.g. 'yield (%%)'")
    rp.set_defaults(func=_cmd_report)
