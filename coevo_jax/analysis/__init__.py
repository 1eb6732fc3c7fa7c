"""Metrics (``metrics``), statistics (``stats``, rliable), figures (``plots``) and the summary CSV
(``tables``) of a study's results (host side). A layer below the runner (:mod:`coevo_jax.experiment`):
nothing here imports it; functions that read a finished study take its result as an argument. The
studies' own analyses (ground truths, credit reports, results tables) live in ``sweeps/_study/analysis``."""
