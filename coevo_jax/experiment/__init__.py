"""The experiment layer: every study is data (:class:`Study` of :class:`Arm` s)
run by one runner (:func:`run_study`), with one definition of each metric
(:mod:`coevo_jax.experiment.metrics`).

Files, one idea each: ``spec`` (what to run), ``plan`` (runs -> batches ->
chunks, run keys), ``worker`` (compile and run one share), ``checkpoint``
(orbax save / restore / refuse), ``launcher`` (``jax.distributed`` worker
processes, progress), ``folder`` (the output folder), ``results`` (merge, summary, files),
``metrics`` (final score, steps to threshold, AUC), ``runner`` (the entry
point), ``cli`` (what the scripts in ``sweeps/`` share), ``admitted`` (the
admitted tasks and their tuned values), ``tuning`` (the equal-budget search).
"""
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.results import StudyResult, format_table, load_result, rebuild_outputs
from coevo_jax.experiment.runner import run_study
from coevo_jax.experiment.spec import Arm, Study, StudyError

__all__ = ["Arm", "Study", "StudyError", "StudyResult", "build_plan", "format_table", "load_result", "rebuild_outputs",
           "run_study"]
