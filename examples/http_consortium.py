"""An HTTP consortium on one machine: the coordinator server and two site processes.

What an operator does, step by step: make a token per site (``labfbo coordinator token``
prints one and its SHA-256), write ``consortium.yaml`` with the digests, start
``labfbo coordinator serve``, and hand each site its URL and token. Here all of it runs
on 127.0.0.1; across organizations, serve on a public address with TLS
(``--ssl-certfile/--ssl-keyfile``), see docs/deployment.md.

Environment:
    LABFBO_EXAMPLE_BUDGET  BO rounds per site (default 10)
    LABFBO_EXAMPLE_OUT     output directory (default: a new temp dir)
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
import yaml

from labfbo.server.config import new_token

OUT = Path(os.environ.get("LABFBO_EXAMPLE_OUT") or tempfile.mkdtemp(prefix="labfbo-http-"))
OUT.mkdir(parents=True, exist_ok=True)
HERE = Path(__file__).resolve().parent
SITES = ["lab-a", "lab-b"]

# 1. tokens: the sites get the tokens, the configuration only their SHA-256
tokens = {site: new_token() for site in SITES}
config = {
    "study": "example-consortium",
    "protocol": "distribution",
    "seed": 0,
    "sites": {site: digest for site, (_, digest) in tokens.items()},
    "state": str(OUT / "coordinator.sqlite"),   # survives a restart
    "audit_log": str(OUT / "audit.jsonl"),      # who sent what, when (no payloads, no tokens)
}
(OUT / "consortium.yaml").write_text(yaml.safe_dump(config))

# 2. the coordinator server (loopback: no TLS needed)
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
url = f"http://127.0.0.1:{port}"
server = subprocess.Popen([sys.executable, "-m", "labfbo.cli", "coordinator", "serve",
                           "--config", str(OUT / "consortium.yaml"), "--port", str(port)])
try:
    up_by = time.monotonic() + 120  # the server imports torch and BoTorch first
    while True:
        try:
            if requests.get(f"{url}/v1/health", timeout=1).ok:
                break
        except requests.ConnectionError:
            if time.monotonic() > up_by or server.poll() is not None:
                sys.exit("the coordinator did not start")
            time.sleep(0.1)
    print(f"coordinator up at {url}")

    # 3. the sites: separate processes, as they would be in separate labs
    def start_site(site: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, str(HERE / "http_site.py")], cwd=OUT, text=True,
                                stdout=subprocess.PIPE,
                                env={**os.environ, "LABFBO_URL": url, "LABFBO_SITE": site,
                                     "LABFBO_TOKEN": tokens[site][0], "LABFBO_EXAMPLE_OUT": str(OUT)})

    def finish(proc: subprocess.Popen) -> None:
        out, _ = proc.communicate(timeout=1800)
        print(out.strip())
        if proc.returncode:
            sys.exit(f"a site failed ({proc.returncode})")

    for proc in [start_site(site) for site in SITES]:
        finish(proc)
    # 4. a site restarted from its journal resumes where it was (here: its campaign is done)
    print("restarting lab-a from its journal:")
    finish(start_site("lab-a"))
finally:
    server.terminate()
    server.wait()
print(f"audit log: {sum(1 for _ in open(OUT / 'audit.jsonl'))} entries in {OUT / 'audit.jsonl'}")
