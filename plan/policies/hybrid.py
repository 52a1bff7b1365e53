"""`hybrid`: Daedalus's choice with DS2's true rates as the capacity when the job reports busy time.

The same choice as `daedalus` (forecast peak, predicted recovery within the target), but the
capacity at a scale-out is DS2's true processing rate times the slots whenever analyze's capacity
view says busy time is reported (the regression otherwise): true rates need no load variation to
be learned.
"""

from __future__ import annotations

from contracts.analyses import Analysis
from plan.policies.daedalus import DaedalusPolicy
from plan.proactive import Capacity, ds2_capacity


class HybridPolicy(DaedalusPolicy):
    name = "hybrid"
    summary = "Daedalus's choice with DS2's true rates as the capacity when busy time is reported"
    needs_forecast = True

    def capacity(self, analysis: Analysis) -> tuple[Capacity | None, str]:
        view = analysis.capacity
        if view is not None and view.source == "ds2":
            rate = analysis.true_processing_rate
            return (lambda p: ds2_capacity(p, rate)), "ds2"
        return super().capacity(analysis)
