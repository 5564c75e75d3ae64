"""Every golden campaign under this process's math kernels, held to ``proposals.json``.

``tests/test_golden.py`` runs it once per kernel setting (environment variables read when torch
and MKL load: ``ATEN_CPU_CAPABILITY=default|avx2|avx512``, ``MKL_ENABLE_INSTRUCTIONS=AVX2``), so
one machine shows what another machine class would propose. By hand::

    ATEN_CPU_CAPABILITY=default .venv/bin/python tests/golden/kernels.py

Prints each campaign that differs from the record, then one JSON line (the campaigns checked,
the capability torch used); exits 1 when any differs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from record import HERE, campaign, differences, space_of  # noqa: E402


def main() -> int:
    import torch

    recorded = json.loads((HERE / "proposals.json").read_text())["proposals"]
    failed = 0
    for key in sorted(recorded):
        space, f = space_of(key)
        wrong = differences(campaign(key.split("/")[0], space, f), recorded[key], space)
        if wrong:
            failed += 1
            print(f"{key}:", *wrong, sep="\n  ", flush=True)
    print(json.dumps({"campaigns": sorted(recorded), "differ": failed,
                      "aten_capability": torch.backends.cpu.get_cpu_capability()}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
