"""The experiment layer: every study is data (:class:`Study` of :class:`Arm` s)
run by one runner (:func:`run_study`) into curves; its scores, tables and plots
are the report's (:mod:`coevo_jax.analysis.report`, one definition of each
metric), which this layer never imports.

Files, one idea each: ``spec`` (what to run), ``plan`` (runs -> batches ->
chunks, run keys), ``worker`` (compile and run the arms over the
devices), ``checkpoint`` (orbax save / restore / refuse / read), ``progress``
(the progress bar), ``folder`` (the output folder), ``results`` (merge,
the result and its files), ``runner`` (devices, hosts, the entry point).
"""
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.results import StudyResult, load_result
from coevo_jax.experiment.runner import run_study, start_devices
from coevo_jax.experiment.spec import Arm, Study, StudyError

__all__ = ["Arm", "Study", "StudyError", "StudyResult", "build_plan", "load_result", "run_study", "start_devices"]
