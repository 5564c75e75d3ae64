"""The site side: what runs in a lab, beside its :class:`~labfbo.Optimizer` (the ask/tell facade).

- :mod:`~labfbo.site.store`: the journal — backend, header, replay (the one place a journal
  is replayed), snapshots;
- :mod:`~labfbo.site.state` and :mod:`~labfbo.site.clock`: the site's state as a fold of its
  journal, and its place on the coordinator's round clock;
- :mod:`~labfbo.site.agent`: joining, the privacy budget, and the coordinator's requests
  answered through a chain of wrappers;
- :mod:`~labfbo.site.data`, :mod:`~labfbo.site.ledger`, :mod:`~labfbo.site.views`: the site's
  data in model coordinates, what crossed its boundary, and its exports;
- :mod:`~labfbo.site.compute`: the process-wide lock of model computations.

This package imports nothing at import time, so any of its modules can be imported alone.
"""
