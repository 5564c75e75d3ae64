"""labfbo's Flower App: the folder ``flwr run`` bundles (see :mod:`labfbo.transport.flower`)."""

from pathlib import Path

APP_DIR = Path(__file__).resolve().parent
"""This folder: ``flwr run <APP_DIR> <superlink> --run-config 'consortium="consortium.yaml"'``."""

