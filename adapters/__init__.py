"""Instrument adapters bundled with labfbo (registered under ``labfbo.adapters``)."""
