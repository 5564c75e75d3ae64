"""labfbo's coordinator as a Flower ``ServerApp`` (its main loop; no Flower ``Strategy``).

Run config: ``consortium`` (path to the consortium.yaml, as for ``labfbo coordinator
serve``), ``poll-timeout`` (seconds, default 30), ``max-seconds`` (0: no limit).
With ``state:`` in the consortium.yaml, a run started again resumes the study.
See :mod:`labfbo.transport.flower_server`.
"""

from __future__ import annotations

from typing import Any

from flwr.serverapp import ServerApp

server_app = ServerApp()


@server_app.main()
def main(grid: Any, context: Any) -> None:
    from labfbo.transport.flower_server import serve_run

    serve_run(grid, context.run_config)
