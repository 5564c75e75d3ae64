"""A small fake REST instrument on 127.0.0.1 (an ephemeral port) for the ``http`` adapter's tests.

It follows the contract in ``adapters/rest.py``: ``POST /runs`` (idempotent per ``key``),
``GET /runs/{id}`` (``running`` for ``polls_to_finish`` polls, then ``done``), and
``GET /runs?key=``. A run whose params contain ``"fail": true`` — or whose ``x`` is above
``fail_above`` — fails; ``busy`` makes every request answer 503.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable
from urllib.parse import parse_qs, urlparse


class FakeInstrument:
    def __init__(self, measure: Callable[[dict[str, Any]], float], polls_to_finish: int = 2,
                 token: str | None = None) -> None:
        self.measure, self.polls_to_finish, self.token = measure, polls_to_finish, token
        self.runs: dict[str, dict[str, Any]] = {}
        self.by_key: dict[str, str] = {}
        self.started: list[str] = []  # keys, in the order runs were started
        self.busy = False
        self.fail_above: float | None = None
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "FakeInstrument":
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        inst = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _refused(self) -> bool:
                if inst.busy:
                    self._send(503, {"detail": "instrument busy"})
                    return True
                if inst.token and self.headers.get("Authorization") != f"Bearer {inst.token}":
                    self._send(401, {"detail": "bad token"})
                    return True
                return False

            def do_POST(self) -> None:  # noqa: N802
                if self._refused():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if "params" not in body:
                    return self._send(422, {"detail": "no params"})
                with inst.lock:
                    run_id = inst.by_key.get(body["key"])
                    if run_id is None:
                        run_id = f"r-{len(inst.runs) + 1}"
                        inst.by_key[body["key"]] = run_id
                        inst.runs[run_id] = {"params": body["params"], "polls": 0}
                        inst.started.append(body["key"])
                self._send(201, {"id": run_id})

            def do_GET(self) -> None:  # noqa: N802
                if self._refused():
                    return
                url = urlparse(self.path)
                if url.path == "/runs":
                    key = parse_qs(url.query).get("key", [""])[0]
                    run_id = inst.by_key.get(key)
                    return self._send(404, {"detail": "no run"}) if run_id is None else self._send(200, {"id": run_id})
                run_id = url.path.rsplit("/", 1)[-1]
                with inst.lock:
                    run = inst.runs.get(run_id)
                    if run is None:
                        return self._send(404, {"detail": "no such run"})
                    run["polls"] += 1
                    polls = run["polls"]
                if polls < inst.polls_to_finish:
                    return self._send(200, {"status": "running"})
                params = run["params"]
                if params.get("fail") or (inst.fail_above is not None and params["x"] > inst.fail_above):
                    return self._send(200, {"status": "failed", "reason": "pump blocked"})
                self._send(200, {"status": "done", "value": inst.measure(params), "sem": 0.01})

        return Handler
