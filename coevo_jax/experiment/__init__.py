"""The experiment layer: a study is data (:class:`Study` of :class:`Arm` s) run by one runner
(:func:`run_study`) into curves; scores, tables and plots are :mod:`coevo_jax.analysis`'s."""
from coevo_jax.experiment.plan import build_plan
from coevo_jax.experiment.results import StudyResult, load_result
from coevo_jax.experiment.runner import run_study, start_devices
from coevo_jax.experiment.spec import Arm, Study, StudyError

__all__ = ["Arm", "Study", "StudyError", "StudyResult", "build_plan", "load_result", "run_study", "start_devices"]
