r"""A real Flower deployment on this machine: one SuperLink, N SuperNodes, ``flwr run``.

What the tests, ``labfbo bench transports`` and ``simulate(transport="flower")`` start,
and the recipe an operator follows by hand (docs/deployment.md, "Flower")::

    with LocalFlowerDeployment(3, workdir, tls=True, auth=True) as fl:
        run = fl.run(consortium_yaml)           # flwr run <labfbo's Flower App> ...
        ...  # the sites' lab scripts: coordinator=fl.sites[i].address, token=fl.sites[i].token
        fl.wait(run)

With ``tls`` the SuperLink serves HTTPS with a certificate signed by a CA made here (with
``cryptography``); the SuperNodes and the ``flwr`` CLI trust that CA. With ``auth`` the
SuperLink admits only SuperNodes whose public key was registered (``flwr supernode
register``); each SuperNode signs its requests with its private key (EC P-384, OpenSSH
format). Everything listens on 127.0.0.1; ports are picked free.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from labfbo.core.exceptions import ConfigurationError, FederationError

STARTUP_TIMEOUT = 60.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = STARTUP_TIMEOUT) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise FederationError(f"the Flower process exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise FederationError(f"nothing listens on 127.0.0.1:{port} after {timeout:g} s: {log.read_text()[-2000:]}")


def make_certificates(folder: Path) -> dict[str, Path]:
    """A CA and a server certificate for 127.0.0.1 / localhost (PEM files in ``folder``)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)

    def cert(subject: str, key: Any, issuer: Any, issuer_key: Any, ca: bool) -> Any:
        builder = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "labfbo test CA")])
    ca_cert = cert("labfbo test CA", ca_key, ca_name, ca_key, True)
    key = ec.generate_private_key(ec.SECP256R1())
    server = cert("127.0.0.1", key, ca_name, ca_key, False)
    paths = {"ca": folder / "ca.pem", "cert": folder / "server.pem", "key": folder / "server.key"}
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    paths["key"].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                               serialization.NoEncryption()))
    return paths


def make_node_key(folder: Path, name: str) -> tuple[Path, Path]:
    """A SuperNode's authentication key pair (EC P-384, OpenSSH format): ``(private, public)``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    key = ec.generate_private_key(ec.SECP384R1())
    private, public = folder / f"{name}.key", folder / f"{name}.pub"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                                          serialization.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(serialization.Encoding.OpenSSH,
                                                     serialization.PublicFormat.OpenSSH))
    private.chmod(0o600)
    return private, public


@dataclass
class FlowerSite:
    """One site's end of the deployment: its bridge address and token, its SuperNode."""

    name: str
    address: str
    token: str
    port: int
    process: subprocess.Popen | None = None

    @property
    def coordinator(self) -> str:
        return f"flower://{self.address}"


class LocalFlowerDeployment:
    """A SuperLink and one SuperNode per site on 127.0.0.1 (see the module docstring)."""

    def __init__(self, sites: int | Sequence[str], workdir: str | os.PathLike[str], *, tls: bool = False,
                 auth: bool = False) -> None:
        if shutil.which("flower-superlink", path=self._path()) is None:
            raise ConfigurationError("the Flower transport needs flwr: pip install 'labfbo[flower]'")
        names = [f"site-{i}" for i in range(sites)] if isinstance(sites, int) else list(sites)
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.tls, self.auth = tls, auth
        self.port = free_port()
        self.sites = [FlowerSite(n, f"127.0.0.1:{free_port()}", secrets.token_urlsafe(24), free_port()) for n in names]
        self.superlink: subprocess.Popen | None = None
        self.certs: dict[str, Path] = {}
        self.keys: dict[str, tuple[Path, Path]] = {}
        self.home = self.workdir / "flwr-home"

    @staticmethod
    def _path() -> str:
        return os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": self._path(), "FLWR_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}

    def _popen(self, args: list[str], log: str) -> subprocess.Popen:
        with open(self.workdir / log, "ab") as out:  # the child keeps its own descriptor
            return subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=self.env(), cwd=self.workdir,
                                    start_new_session=True)

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> "LocalFlowerDeployment":
        try:
            return self._start()
        except BaseException:
            self.stop()  # nothing started may outlive a failed start
            raise

    def _start(self) -> "LocalFlowerDeployment":
        self.home.mkdir(exist_ok=True)
        link = ["flower-superlink", "--port", str(self.port), "--disable-runtime-dependency-installation"]
        if self.tls:
            self.certs = make_certificates(self.workdir / "certs")
            link += ["--ssl-ca-certfile", str(self.certs["ca"]), "--ssl-certfile", str(self.certs["cert"]),
                     "--ssl-keyfile", str(self.certs["key"])]
        else:
            link.append("--insecure")
        if self.auth:
            link.append("--enable-supernode-auth")
        conn = [f'address = "127.0.0.1:{self.port}"',
                f'root-certificates = "{self.certs["ca"]}"' if self.tls else "insecure = true"]
        (self.home / "config.toml").write_text('[superlink]\ndefault = "labfbo"\n\n[superlink.labfbo]\n'
                                               + "\n".join(conn) + "\n")
        self.superlink = self._popen(link, "superlink.log")
        _wait_port(self.port, self.superlink, self.workdir / "superlink.log")
        for i in range(len(self.sites)):
            self.start_node(i)
        return self

    def _flwr(self, *args: str, timeout: float = 60.0) -> str:
        done = subprocess.run(["flwr", *args], capture_output=True, text=True, env=self.env(), cwd=self.workdir,
                              timeout=timeout)
        if done.returncode != 0:
            raise FederationError(f"flwr {' '.join(args)} failed: {done.stdout[-1500:]} {done.stderr[-1500:]}")
        return done.stdout

    def start_node(self, i: int, timeout: float = 180.0) -> None:
        """Start (or restart) site ``i``'s SuperNode; wait until the SuperLink has activated it.

        A restarted SuperNode with the same key is refused until the SuperLink has noticed
        that the old one is gone (two missed heartbeats): it is started again until it is in.
        """
        site = self.sites[i]
        token_file = self.workdir / f"token-{site.name}"
        token_file.touch(mode=0o600)
        token_file.write_text(site.token)
        args = ["flower-supernode", "--superlink", f"127.0.0.1:{self.port}", "--port", str(site.port),
                "--node-config", f'labfbo-site="{site.address}" labfbo-token-file="{token_file}"']
        args += ["--root-certificates", str(self.certs["ca"])] if self.tls else ["--insecure"]
        if self.auth:
            if site.name not in self.keys:
                self.keys[site.name] = make_node_key(self.workdir, f"node-{site.name}")
                self._flwr("supernode", "register", str(self.keys[site.name][1]), "labfbo")
            args += ["--auth-supernode-private-key", str(self.keys[site.name][0])]
        log = self.workdir / f"supernode-{site.name}.log"
        end = time.monotonic() + timeout
        while True:
            start = log.stat().st_size if log.exists() else 0
            site.process = self._popen(args, log.name)
            while site.process.poll() is None:
                with open(log, "rb") as f:
                    f.seek(start)
                    if b"SuperNode ID" in f.read():
                        return
                if time.monotonic() > end:
                    raise FederationError(f"SuperNode {site.name} not activated within {timeout:g} s: "
                                          f"{log.read_text(errors='replace')[-2000:]}")
                time.sleep(0.3)
            self._kill_group(site.process)  # refused (exit code 305): its helpers go too; try again
            if time.monotonic() > end:
                raise FederationError(f"SuperNode {site.name} keeps exiting: {log.read_text(errors='replace')[-2000:]}")
            time.sleep(3.0)

    @staticmethod
    def _kill_group(proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)

    def kill_node(self, i: int) -> None:
        """Kill site ``i``'s SuperNode (SIGKILL to its process group: no goodbye)."""
        proc = self.sites[i].process
        if proc is not None:
            self._kill_group(proc)

    def run(self, consortium: str | os.PathLike[str], **run_config: Any) -> subprocess.Popen:
        """``flwr run`` labfbo's Flower App for ``consortium`` (a consortium.yaml); streams its log."""
        from labfbo.flower_app import APP_DIR

        app = self.workdir / "app"
        if not app.exists():  # a private copy: flwr may write next to the app it bundles
            shutil.copytree(APP_DIR, app, ignore=shutil.ignore_patterns("__pycache__", "__init__.py"))
        pairs = [f'consortium="{Path(consortium).resolve()}"']
        pairs += [f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}" for k, v in run_config.items()]
        log = f"run-{int(time.time() * 1000)}.log"
        proc = self._popen(["flwr", "run", str(app), "labfbo", "--stream", "--run-config", " ".join(pairs)], log)
        proc.log = self.workdir / log  # type: ignore[attr-defined]
        return proc

    def wait(self, run: subprocess.Popen, timeout: float = 600.0) -> str:
        """Wait for ``flwr run`` to end; its log (raises if the ServerApp failed)."""
        try:
            run.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cancel(run)
            raise FederationError(f"the Flower run did not end within {timeout:g} s") from None
        text = Path(run.log).read_text(errors="replace")  # type: ignore[attr-defined]
        if run.returncode != 0 or "labfbo: study" not in text:
            raise FederationError(f"the Flower run failed ({run.returncode}): {text[-3000:]}")
        return text

    def cancel(self, run: subprocess.Popen) -> None:
        """Stop the run on the SuperLink (``flwr stop``), not only the ``flwr run`` that streams its log."""
        import re

        found = re.search(r"Successfully started run (\d+)", Path(run.log).read_text(errors="replace"))  # type: ignore[attr-defined]
        if found:
            try:
                self._flwr("stop", found.group(1), "labfbo")
            except (FederationError, subprocess.TimeoutExpired):
                pass  # it has ended already
        if run.poll() is None:
            self._kill_group(run)

    def stop(self) -> None:
        for proc in [s.process for s in self.sites] + [self.superlink]:
            if proc is None or proc.poll() is not None:
                continue
            try:
                os.killpg(proc.pid, 15)  # the process group: Flower's helper processes (SuperExec) too
                proc.wait(timeout=10)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                self._kill_group(proc)

    def __enter__(self) -> "LocalFlowerDeployment":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
