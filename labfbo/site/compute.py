"""The process-wide lock of model computations.

GP fits and acquisition optimization of every site in this process run one at a time:
torch's RNG and Python's warning filters are process-global, and a transport thread
answering the coordinator must not interleave with a lab script's proposal (nor a report
being drawn with either).
"""

from __future__ import annotations

import threading

COMPUTE = threading.RLock()
