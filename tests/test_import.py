"""Importing the library changes no global state: no environment variable, no JAX lowering rule, no
matplotlib setting (no backend chosen, pyplot not loaded);
its layers import only downwards (the report's statistics and plots above the runner); and the library is
only the library: no module of ``coevo_jax`` imports the studies' code (``sweeps/``, ``_study``)."""
import ast
import glob
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = """
import os, sys
sys.path.insert(0, {root!r})
import jax, flax, optax, chex, distrax, gymnax, xminigrid, orbax.checkpoint  # the dependencies' own effects first
from jax._src.interpreters import mlir
from jax._src import xla_bridge

def lowerings():
    rules = {{("*", p): r for p, r in mlir._lowerings.items()}}
    rules.update({{(plat, p): r for plat, d in mlir._platform_specific_lowerings.items() for p, r in d.items()}})
    return rules

import matplotlib
mpl = (dict(matplotlib.rcParams), "matplotlib.pyplot" in sys.modules)
env, rules, started = dict(os.environ), lowerings(), bool(xla_bridge._backends)  # xminigrid starts it
import coevo_jax, envs_jax, coevo_jax.experiment  # noqa: F401
above = sorted(m for m in sys.modules if m.startswith("coevo_jax.analysis"))  # the report sits above the runner
import importlib, pkgutil, coevo_jax.analysis
for m in pkgutil.iter_modules(coevo_jax.analysis.__path__):
    importlib.import_module(f"coevo_jax.analysis.{{m.name}}")
changed = sorted(k for k in set(env) | set(os.environ) if env.get(k) != os.environ.get(k))
after = lowerings()
new_rules = sorted(f"{{plat}}:{{p}}" for (plat, p), r in after.items() if rules.get((plat, p)) is not r)
print("env", changed)
print("rules", new_rules)
print("backend", bool(xla_bridge._backends) and not started)
print("core loads", above)
print("matplotlib", (dict(matplotlib.rcParams), "matplotlib.pyplot" in sys.modules) == mpl)
"""


def test_import_changes_no_environment_variable_and_no_lowering():
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", PROBE.format(root=ROOT)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()[-5:]
    assert lines == ["env []", "rules []", "backend False", "core loads []", "matplotlib True"], out.stdout


def imported_modules(path: str) -> set:
    """Every module ``path`` imports, at the top or inside a function (absolute names)."""
    pkg = os.path.relpath(os.path.dirname(path), ROOT).replace(os.sep, ".")
    names = set()
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(pkg.split(".")[:len(pkg.split(".")) - node.level + 1] + ([base] if base else []))
            names |= {base} | {f"{base}.{a.name}" for a in node.names}
    return names


def test_layers_import_only_downwards():
    """The report (coevo_jax.analysis) reads the runner's results; nothing below it (the core, the runner
    included) imports it, and nothing in the library imports the study scripts' helpers."""
    above = ("coevo_jax.analysis",)
    wrong = []
    for path in sorted(glob.glob(os.path.join(ROOT, "coevo_jax", "**", "*.py"), recursive=True)):
        module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
        for name in imported_modules(path):
            if name.split(".")[0] in ("_study", "sweeps") or (
                    name.startswith(above) and not module.startswith(above)):
                wrong.append(f"{module} imports {name}")
    assert not wrong, wrong


REPORT = "analysis"  # coevo_jax.analysis: the report of a study (statistics, plots), above the core

WALK = """
import importlib, os, pkgutil, sys
sys.path[:0] = [{root!r}, os.path.join({root!r}, "sweeps")]  # the studies' helpers importable: none may be imported
import coevo_jax
def walk(path, prefix):
    for m in pkgutil.iter_modules(path, prefix):
        if m.name != "coevo_jax." + {report!r}:
            module = importlib.import_module(m.name)
            if m.ispkg:
                walk(module.__path__, m.name + ".")
walk(coevo_jax.__path__, "coevo_jax.")
sweeps = os.path.join({root!r}, "sweeps") + os.sep
print("modules", len({{"coevo_jax"}} | {{m for m in sys.modules if m.startswith("coevo_jax.")}}))
print("study", sorted(m for m, mod in list(sys.modules.items()) if m.split(".")[0] in ("_study", "sweeps")
                      or (getattr(mod, "__file__", None) or "").startswith(sweeps)
                      or m.startswith("coevo_jax." + {report!r})
                      or m.split(".")[0] in ("matplotlib", "rliable", "pandas")))
"""


def core_lines() -> tuple[int, int]:
    """``(files, lines)`` of the core library's Python source (``coevo_jax/**/*.py`` less the report
    package ``coevo_jax/analysis``)."""
    paths = [p for p in glob.glob(os.path.join(ROOT, "coevo_jax", "**", "*.py"), recursive=True)
             if os.path.relpath(p, os.path.join(ROOT, "coevo_jax")).split(os.sep)[0] != REPORT]
    lines = 0
    for path in paths:
        with open(path) as f:
            lines += sum(1 for _ in f)
    return len(paths), lines


def test_the_core_imports_no_study_code(record_property):
    """Importing every module of the core (``coevo_jax`` less the report package ``coevo_jax.analysis``,
    walked with pkgutil, ``sweeps/`` on the path) loads no module of the studies (``_study``, anything under
    ``sweeps/``), none of the report's and none of its statistics and plotting packages (matplotlib, rliable,
    pandas): the library holds only the library, and the runner computes no statistics. Its size is
    reported (``record_property`` and the captured output), not asserted."""
    out = subprocess.run([sys.executable, "-c", WALK.format(root=ROOT, report=REPORT)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    modules, study = out.stdout.strip().splitlines()[-2:]
    assert study == "study []", study
    files, lines = core_lines()
    assert modules == f"modules {files}", modules  # the walk reached every file of the package
    record_property("coevo_jax_lines", lines)
    print(f"coevo_jax (core, without {REPORT}/): {lines} lines in {files} files")

def test_the_safe_flag_is_an_explicit_opt_in():
    from coevo_jax.runtime import SAFE_FLAG, use_safe_xla_flags

    env = {"XLA_FLAGS": "--xla_dump_to=x"}
    assert use_safe_xla_flags(env) and env["XLA_FLAGS"] == f"--xla_dump_to=x {SAFE_FLAG}"
    assert not use_safe_xla_flags(env) and env["XLA_FLAGS"].count("concurrency_optimized") == 1
    mine = {"XLA_FLAGS": "--xla_cpu_enable_concurrency_optimized_scheduler=true"}
    assert not use_safe_xla_flags(mine) and mine["XLA_FLAGS"].endswith("=true")  # a user's own choice wins


def test_the_public_names_resolve_and_hold_no_registry_mutation():
    import coevo_jax as cj
    from coevo_jax import registry

    assert len(set(cj.__all__)) == len(cj.__all__)
    public = {name: getattr(cj, name) for name in cj.__all__}  # every name resolves
    namespace = {}
    exec("from coevo_jax import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(cj.__all__)
    composed = {"make_train", "Trainer", "TrainState", "StaticConfig", "HParams", "default_hparams", "ConfigError",
                "validate_hparams", "validate_static", "gae", "ppo_loss", "ppo_update", "rollout", "Trajectory",
                "Signal", "make_signal", "registered_methods", "method_spec", "make_policy_network", "ActorCritic"}
    assert composed <= set(public)
    mutators = (registry.register_method, registry.unregister_method, registry.MethodSpec, registry.Param, registry)
    assert not [n for n, obj in public.items() if any(obj is m for m in mutators)]
    assert not {"register_method", "unregister_method", "registry", "MethodSpec", "Param"} & set(public)


def test_the_report_without_its_extra_names_the_extra():
    """Without the ``report`` extra's packages, importing ``coevo_jax.analysis`` fails with one message that
    names what is missing and the install command; the core imports as before."""
    code = ("import sys; sys.modules['rliable'] = None\n"  # (find_spec: a None entry is a module not installed)
            "import coevo_jax, coevo_jax.experiment\n"
            "try:\n    import coevo_jax.analysis.report\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == ("coevo_jax.analysis (a study's report) needs rliable: install the report extra,"
                                  ' python -m pip install -e ".[report]" -c constraints.txt'), out.stdout
