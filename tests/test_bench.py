"""sweeps/bench.py: where the PureJaxRL anchor comes from (no PureJaxRL code in this repository)."""
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "sweeps", "bench.py")


def _bench():
    spec = importlib.util.spec_from_file_location("sweeps_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # stdlib imports only: jax loads in the worker processes
    return mod


def test_missing_purejaxrl_folder_says_how_to_get_it(tmp_path):
    folder, tool, why = _bench().anchor_paths(str(tmp_path / "absent"), None)
    assert folder is None and tool is None
    assert why.startswith("PureJaxRL rows skipped")
    assert "git clone https://github.com/luchris429/purejaxrl" in why and "--purejaxrl" in why


def test_missing_harness_is_reported(tmp_path):
    for name in ("ppo.py", "wrappers.py"):
        (tmp_path / name).write_text("")
    folder, tool, why = _bench().anchor_paths(str(tmp_path), str(tmp_path / "no_tool.py"))
    assert folder is None and "--purejaxrl-tool" in why


def test_present_anchor_and_harness_are_used(tmp_path):
    for name in ("ppo.py", "wrappers.py", "tool.py"):
        (tmp_path / name).write_text("")
    folder, tool, why = _bench().anchor_paths(str(tmp_path), str(tmp_path / "tool.py"))
    assert why is None and folder == str(tmp_path) and tool == str(tmp_path / "tool.py")


def test_defaults_are_beside_the_repository():
    b = _bench()
    parent = os.path.dirname(ROOT)
    assert os.path.normpath(b.DEFAULT_PUREJAXRL) == os.path.join(parent, "shared", "anchors", "purejaxrl")
    assert os.path.normpath(b.DEFAULT_PUREJAXRL_TOOL) == os.path.join(parent, "shared", "tools", "purejaxrl_bench.py")


def test_help_runs():
    out = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0
    for opt in ("--ppo-seeds", "--reps", "--purejaxrl", "--purejaxrl-tool", "--total-steps"):
        assert opt in out.stdout
