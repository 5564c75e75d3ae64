"""labfbo's benchmark campaigns: ``labfbo bench <suite>``.

The seed papers' suites (``pmcbo``, ``pacd``, ``guide``), the single-site engine panel, the
reaction-data campaigns, the privacy–utility grids and the micro-benchmarks (latency,
round time, transports, ...). Installed with labfbo as the top-level package ``labfbo_bench``
(source: the repository's ``benchmarks/`` folder); labfbo itself never imports it.

Each suite module exposes ``add_parser(subparsers)`` and is registered in the
``labfbo.bench`` entry-point group (``pyproject.toml``), which ``labfbo bench`` reads;
``BENCH_ORDER`` places its subcommand in ``labfbo bench --help``. The problems these suites
run are :mod:`labfbo.problems`, the cached job runner and the tables are :mod:`labfbo.apps.harness`,
the reaction data :mod:`labfbo.datasets`.
"""
