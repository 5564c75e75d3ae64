"""Transports move messages between sites and the coordinator; they know no protocol."""
