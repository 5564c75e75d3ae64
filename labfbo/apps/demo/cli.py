"""``labfbo demo``: the reagent screen's command line (:mod:`labfbo.apps.demo.screen`)."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_demo(args: argparse.Namespace) -> int:
    from labfbo.apps.demo.screen import DemoConfig, run_demo

    labs = int(args.labs[0]) if len(args.labs) == 1 and args.labs[0].isdigit() else args.labs
    seeds = [args.seed] if args.seed is not None else args.seeds
    run_demo(DemoConfig(labs=labs, budget=args.budget, seeds=seeds, optuna=not args.no_optuna, out=args.out,
                        workers=args.workers))
    return 0


def add_parser(sub: Any) -> None:
    demo = sub.add_parser("demo", help="a reagent screen of 3 labs on real Buchwald-Hartwig data: together "
                          "(surface), alone and Optuna alone, over 4 seeds; table, plot and each lab's report "
                          "under runs/")
    demo.add_argument("--labs", nargs="+", default=["3"], metavar="LAB",
                      help="how many of the most related labs (2 to 5; default 3), or aryl halide names")
    demo.add_argument("--budget", type=int, default=17, help="experiments per lab after the 3 shared first ones")
    which = demo.add_mutually_exclusive_group()
    which.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3], metavar="SEED",
                       help="the seeds to run and average (default 0 1 2 3)")
    which.add_argument("--seed", type=int, default=None, help="one seed only (same as --seeds SEED)")
    demo.add_argument("--workers", type=int, default=2, help="processes running seeds in parallel (default 2)")
    demo.add_argument("--no-optuna", action="store_true", help="leave out the Optuna comparison")
    demo.add_argument("--out", default="runs", help="results go to OUT/demo-<time>/")
    demo.set_defaults(func=_cmd_demo)
