"""Compiler options the tests share."""

#: XLA:CPU -O0 without the fusion emitters: compiles about 2x faster. For tests that check
#: semantics (shapes, equivalences, learning at tiny budgets), not speed.
OPT0 = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
