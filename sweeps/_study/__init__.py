"""What the study scripts in ``sweeps/`` share (an application of :mod:`coevo_jax.experiment`,
not part of the library): ``cli`` (the options every script has, its main loop and one-line
errors), ``options`` (option parsing), ``publish`` (``--publish``: a report with its command,
commit and machine), ``figures`` (``small_png``: every figure written small), ``admitted``
(calibration's admitted-task file and its tuned values),
``tuning`` (the equal-budget search of ``sweeps/tune.py``), ``controls`` (the tuned controls),
``verdict`` (the comparison's verdict rule), ``random_policy`` (the uniform-random row of every
table), ``analysis/`` (the studies' own analyses: ground-truth credit, credit quality, text and
turn reports, the results tables) and ``bench/`` (the measurements of ``sweeps/bench.py``).
The library (:mod:`coevo_jax`) imports nothing from here.

A script run as ``python sweeps/<script>.py`` finds this package on its path (``sweeps/``
comes first); the tests add ``sweeps/`` to theirs.
"""
