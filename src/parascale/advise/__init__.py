"""``parascale advise``: what to run and how long it will take to reach the goal.

From a job (train's options), the resources (CPU workers here, or a cluster described) and a
goal (a target on a metric, or a budget), advise measures what it needs here, briefly, or
takes it from records and figures given by hand; searches devices, per-device batch,
accumulation, strategy and the learning-rate rule; predicts each configuration's time to the
goal with a band; and ranks them. Modules: ``options`` (the question, checked), ``measure``
(the short study here), ``readings`` (records and figures to the inputs), ``space`` (the
configurations), ``model`` (the arithmetic), ``forecast`` (one configuration's prediction),
``rank`` (the recommendation and its limits), ``output`` (text and files), ``verify`` (the
advice run and measured), ``advice`` (the steps in order). Formulas: docs/advise.md.
"""
from parascale.advise.advice import advise
from parascale.advise.options import Options, validate
from parascale.advise.rank import Advice

__all__ = ["Advice", "Options", "advise", "validate"]
