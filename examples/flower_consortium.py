"""The same consortium on Flower: a SuperLink, a SuperNode per lab, labfbo's ServerApp.

What an operator does on a Flower deployment (docs/deployment.md, "Flower"), all on
127.0.0.1 here: TLS with the consortium's CA, SuperNode authentication with a registered
key per lab, one SuperNode per lab whose node config names the lab's bridge and token,
``flwr run`` of labfbo's Flower App with the ``consortium.yaml``. Each lab then runs its
ordinary lab script (``http_site.py``) with ``LABFBO_URL=flower://127.0.0.1:PORT``.
Every Flower exchange takes seconds: keep the budget small.

Environment:
    LABFBO_EXAMPLE_BUDGET  BO rounds per site (default 3)
    LABFBO_EXAMPLE_OUT     output directory (default: a new temp dir)
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from labfbo.server.config import hash_token
from labfbo.transport.flower_deploy import LocalFlowerDeployment

OUT = Path(os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-flower-"))
OUT.mkdir(parents=True, exist_ok=True)
HERE = Path(__file__).resolve().parent
SITES = ["lab-a", "lab-b"]

with LocalFlowerDeployment(SITES, OUT / "flower", tls=True, auth=True) as fl:
    print(f"SuperLink on 127.0.0.1:{fl.port} (TLS, SuperNode authentication); SuperNodes up")
    config = {"study": "example-consortium", "protocol": "distribution", "seed": 0,
              "sites": {s.name: hash_token(s.token) for s in fl.sites}}
    (OUT / "consortium.yaml").write_text(yaml.safe_dump(config))
    run = fl.run(OUT / "consortium.yaml")  # flwr run <labfbo's Flower App> ... --run-config consortium=...

    labs = [subprocess.Popen([sys.executable, str(HERE / "http_site.py")], cwd=OUT, text=True, stdout=subprocess.PIPE,
                             env={**os.environ, "LABFBO_URL": s.coordinator, "LABFBO_SITE": s.name,
                                  "LABFBO_TOKEN": s.token, "LABFBO_EXAMPLE_OUT": str(OUT),
                                  "LABFBO_EXAMPLE_BUDGET": os.environ.get("LABFBO_EXAMPLE_BUDGET", "3")})
            for s in fl.sites]
    for lab in labs:
        out, _ = lab.communicate(timeout=1800)
        print(out.strip())
        if lab.returncode:
            sys.exit(f"a site failed ({lab.returncode})")
    log = fl.wait(run)
    print("\n".join(line for line in log.splitlines() if line.startswith("labfbo:")))
