"""``http``: an instrument with a REST interface — POST the parameters, poll for the result.

The contract (paths and field names configurable)::

    POST {url}/runs        {"key": "lab-a/7", "trial_id": 7, "params": {...}}  -> {"id": "r-19", ...}
    GET  {url}/runs/r-19   -> {"status": "running"}                            (in progress)
                           -> {"status": "done", "value": 0.41, "sem": 0.02}   (measured)
                           -> {"status": "failed", "reason": "pump blocked"}   (failed)
    GET  {url}/runs?key=lab-a/7  -> the run submitted with that key, or 404    (crash recovery)

``key`` is the site, the campaign's id and the trial id, so an instrument that honours
it never starts the same trial twice — the adapter re-sends a submission whose answer it
did not get (a 409 answer then means "already have it": the run is looked up by key).
Network errors, time-outs, 408/425/429 and 5xx answers are transient (the loop retries),
and so are 401/403 answers to a status request (the run goes on while a token is
renewed); any other 4xx answer to a submission fails the trial with the instrument's
message, and 404 for a run fails it as unknown to the instrument.
"""

from __future__ import annotations

import os
from typing import Any

import requests

from labfbo.adapters import Adapter, AdapterContext, Handle, InstrumentBusy, Measurement
from labfbo.core.exceptions import ConfigurationError
from labfbo.core.trial import Trial

TRANSIENT = (408, 425, 429)  # time-out, too early, too many requests: ask again later
DONE = ("done", "completed", "complete", "succeeded", "success")
FAILED = ("failed", "error", "aborted", "cancelled", "canceled")


class RestInstrumentAdapter(Adapter):
    """Args:
        url: the instrument's base URL.
        submit_path, status_path: ``"/runs"`` and ``"/runs/{id}"``.
        id_field, status_field, value_field, sem_field, reason_field: names in the JSON answers.
        token_env: an environment variable holding a bearer token (never put it in the config).
        timeout: seconds per HTTP request. poll_interval: seconds between polls.
        verify: TLS verification (True, False or a CA bundle path).
    """

    name = "http"

    def __init__(self, url: str, submit_path: str = "/runs", status_path: str = "/runs/{id}", id_field: str = "id",
                 status_field: str = "status", value_field: str = "value", sem_field: str = "sem",
                 reason_field: str = "reason", token_env: str | None = None, timeout: float = 10.0,
                 poll_interval: float = 5.0, verify: bool | str = True) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"http adapter: url must start with http:// or https://, got {url!r}")
        if "{id}" not in status_path:
            raise ConfigurationError("http adapter: status_path must contain '{id}'")
        self.url = url.rstrip("/")
        self.submit_path, self.status_path = submit_path, status_path
        self.fields = {"id": id_field, "status": status_field, "value": value_field, "sem": sem_field,
                       "reason": reason_field}
        self.timeout, self.poll_interval, self.verify = float(timeout), float(poll_interval), verify
        self._session = requests.Session()
        if token_env:
            token = os.environ.get(token_env)
            if not token:
                raise ConfigurationError(f"http adapter: environment variable {token_env} is not set")
            self._session.headers["Authorization"] = f"Bearer {token}"
        self._site, self._campaign = "site", ""

    def prepare(self, context: AdapterContext) -> None:
        self._site, self._campaign = context.site, context.campaign

    def _request(self, method: str, path: str, **kw: Any) -> requests.Response:
        try:
            response = self._session.request(method, self.url + path, timeout=self.timeout, verify=self.verify, **kw)
        except requests.RequestException as exc:
            raise InstrumentBusy(f"instrument unreachable: {exc}") from exc
        if response.status_code >= 500 or response.status_code in TRANSIENT:
            raise InstrumentBusy(f"instrument answered {response.status_code}: {response.text[:200]}")
        return response

    def _json(self, response: requests.Response) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError:
            raise RuntimeError(f"instrument answered {response.status_code} with non-JSON: "
                               f"{response.text[:200]}") from None
        if not isinstance(body, dict):
            raise RuntimeError(f"instrument answered {body!r}, expected a JSON object")
        return body

    def _key(self, trial: Trial) -> str:
        """Unique per site, campaign and trial: an earlier campaign's run 7 is never taken for ours."""
        return f"{self._site}/{self._campaign}/{trial.id}" if self._campaign else f"{self._site}/{trial.id}"

    def submit(self, trial: Trial) -> Handle:
        response = self._request("POST", self.submit_path,
                                 json={"key": self._key(trial), "trial_id": trial.id, "params": trial.params})
        if response.status_code == 409:  # "already submitted": a re-sent submission; find the run
            handle = self.recover(trial)
            if handle is not None:
                return handle
        if response.status_code >= 400:
            raise RuntimeError(f"instrument refused the run ({response.status_code}): {response.text[:300]}")
        body = self._json(response)
        if self.fields["id"] not in body:
            raise RuntimeError(f"instrument's answer has no {self.fields['id']!r} field: {body}")
        return {"id": str(body[self.fields["id"]])}

    def recover(self, trial: Trial) -> Handle | None:
        response = self._request("GET", self.submit_path, params={"key": self._key(trial)})
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise RuntimeError(f"instrument refused the look-up ({response.status_code}): {response.text[:300]}")
        body = self._json(response)
        return {"id": str(body[self.fields["id"]])} if self.fields["id"] in body else None

    def poll(self, handle: Handle) -> Measurement | None:
        response = self._request("GET", self.status_path.format(id=handle["id"]))
        if response.status_code in (401, 403):  # e.g. a rotated token: the run goes on, keep asking
            raise InstrumentBusy(f"instrument refused the status request ({response.status_code}); check the token")
        if response.status_code >= 400:
            return Measurement.failure(f"instrument has no run {handle['id']} ({response.status_code})")
        body = self._json(response)
        status = str(body.get(self.fields["status"], "")).lower()
        extra = {"instrument_run": handle["id"]}
        if status in FAILED:
            return Measurement.failure(str(body.get(self.fields["reason"]) or f"instrument status {status!r}"), **extra)
        if status not in DONE:
            return None
        sem = body.get(self.fields["sem"])
        return Measurement.ok(float(body[self.fields["value"]]), None if sem is None else float(sem), **extra)

    def close(self) -> None:
        self._session.close()
