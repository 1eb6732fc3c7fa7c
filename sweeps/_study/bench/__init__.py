"""Throughput and cost measurements behind ``sweeps/bench.py`` (which only parses
options and prints the tables).

Two files, one idea each: ``workers`` (the measurements, each run inside a fresh
process: ``python -m _study.bench.workers '{"kind": ...}'``, ``sweeps/`` on its path) and
``launch`` (starting those processes and PureJaxRL's unmodified ``ppo.py``
through its harness, time limits, the PureJaxRL side-by-side loop). Both import
JAX only inside the measurements, so every measurement's compile time and peak
memory belong to its own process.
"""
