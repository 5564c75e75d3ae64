"""The bottom layer: what every other layer shares and nothing above it defines.

Exceptions, seeds from (seed, site, round, purpose), every cross-site message as a pydantic
model and its wire frame, the journal's typed records and storage, trials and objectives,
the release declaration (what a message releases) and the DP settings.
"""
