"""Three labs choose base, ligand and additive from lists: a categorical reaction screen.

Each "lab" is one aryl halide of the Buchwald-Hartwig data shipped with labfbo (Ahneman
et al., Science 360, 186 (2018)); its yields stay inside the lab's ``experiment``. The
consortium agrees on the reagent lists and on the base/ligand pairs in stock (the
``allowed`` table, part of the study's identity), and runs ``protocol="surface"``, the
protocol we recommend for categorical lab spaces: each round a lab sends the averaged
sufficient statistics of a regression of its standardized yields on the reagent choices,
and its model starts from the response surface the other labs' statistics give — the main
effect of every base, ligand and additive — scaled by how well it agrees with the lab's own
results. Only those statistics leave a lab, never a yield — and with three labs or more
they leave masked into a sum that only the labs can open (secure aggregation): the
coordinator learns nothing of them.

A combination a lab cannot run (missing from its data here; a failed run in a real lab)
is reported with ``tell_failed`` and costs an experiment, as it would.

Environment:
    LABFBO_EXAMPLE_BUDGET  BO rounds after 3 initial experiments per lab (default 15)
    LABFBO_EXAMPLE_OUT     output directory (default: a new temp dir)
"""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

import labfbo  # noqa: E402
from labfbo.datasets import load_reactions  # noqa: E402

BUDGET = int(os.environ.get("LABFBO_EXAMPLE_BUDGET", "15"))
OUT = os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-reagents-")
os.makedirs(OUT, exist_ok=True)

data = load_reactions()
LABS = {"lab-a": "1-bromo-4-ethylbenzene", "lab-b": "2-bromopyridine", "lab-c": "1-ethyl-4-iodobenzene"}
tables = {site: data.tables[data.labs.index(halide)] for site, halide in LABS.items()}

choices = {p.name: list(p.choices) for p in data.space.params}
in_stock = [{"base": b, "ligand": g} for b in choices["base"] for g in choices["ligand"]
            if (b, g) != ("MTBD", "AdBrettPhos")]  # one pair the consortium cannot supply
space = labfbo.SearchSpace([labfbo.Categorical(name, values) for name, values in choices.items()],
                           allowed=in_stock)


def experiment(site: str, params: dict) -> float | None:
    """The lab's yield (percent), or None if the run failed."""
    return tables[site].get((params["base"], params["ligand"], params["additive"]))


PROTOCOL = "surface"
coordinator = labfbo.Coordinator(protocol=PROTOCOL, sites=list(LABS), seed=0)
optimizers = {site: labfbo.Optimizer(space, objective="maximize", protocol=PROTOCOL, coordinator=coordinator,
                                     site=site, seed=0, n_init=3, storage=os.path.join(OUT, f"{site}.journal"))
              for site in LABS}


def run(site: str, trial: labfbo.Trial) -> None:
    y = experiment(site, trial.params)
    if y is None:
        optimizers[site].tell_failed(trial, "reaction failed")
    else:
        optimizers[site].tell(trial, y)


for site, opt in optimizers.items():
    for trial in opt.ask(n=opt.n_init):
        run(site, trial)
for rnd in range(BUDGET):
    trials = {site: opt.ask() for site, opt in optimizers.items()}
    for site, trial in trials.items():
        assert space.is_allowed(trial.params)
        run(site, trial)
    print(f"round {rnd}: " + "  ".join(f"{s}={o.best.value:5.1f}%" for s, o in optimizers.items()))

for site, opt in optimizers.items():
    best_possible = max(tables[site].values())
    kinds = sorted({m.kind for m in opt.sent_messages()})
    print(f"{site}: best yield {opt.best.value:.1f}% (the best in its data: {best_possible:.1f}%) with "
          f"{opt.best.params}; sent {kinds}, never a yield")
    opt.close()
