"""sweeps/bench.py and _study.bench: where the PureJaxRL anchor comes from (no PureJaxRL
code in this repository), the option presets and the scale section's budget (nothing here runs JAX,
but for one tiny measurement in a worker process: the launcher finds its workers beside the studies)."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

from _study.bench import launch
from _study.bench.workers import scale_steps

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "sweeps", "bench.py")


def _bench():
    spec = importlib.util.spec_from_file_location("sweeps_bench", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # the measurements run in worker processes
    return mod


def test_missing_purejaxrl_folder_says_how_to_get_it(tmp_path):
    folder, tool, why = launch.anchor_paths(str(tmp_path / "absent"), None)
    assert folder is None and tool is None
    assert why.startswith("PureJaxRL rows skipped")
    assert "git clone https://github.com/luchris429/purejaxrl" in why and "--purejaxrl" in why


def test_missing_harness_is_reported(tmp_path):
    for name in ("ppo.py", "wrappers.py"):
        (tmp_path / name).write_text("")
    folder, tool, why = launch.anchor_paths(str(tmp_path), str(tmp_path / "no_tool.py"))
    assert folder is None and "--purejaxrl-tool" in why


def test_present_anchor_and_harness_are_used(tmp_path):
    for name in ("ppo.py", "wrappers.py", "tool.py"):
        (tmp_path / name).write_text("")
    folder, tool, why = launch.anchor_paths(str(tmp_path), str(tmp_path / "tool.py"))
    assert why is None and folder == str(tmp_path) and tool == str(tmp_path / "tool.py")


def test_defaults_are_beside_the_repository():
    assert launch.ROOT == ROOT and launch.SWEEPS == os.path.join(ROOT, "sweeps")
    parent = os.path.dirname(ROOT)
    assert os.path.normpath(launch.DEFAULT_PUREJAXRL) == os.path.join(parent, "shared", "anchors", "purejaxrl")
    assert os.path.normpath(launch.DEFAULT_PUREJAXRL_TOOL) == os.path.join(parent, "shared", "tools",
                                                                           "purejaxrl_bench.py")


def test_help_runs():
    out = subprocess.run([sys.executable, BENCH, "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0
    for opt in ("--ppo-seeds", "--reps", "--purejaxrl", "--purejaxrl-tool", "--total-steps", "--scale-runs",
                "--device-script", "--smoke", "--deadline"):
        assert opt in out.stdout


def test_device_script_preset_and_overrides():
    b = _bench()
    a = b.parse_args(["--device-script"])
    assert a.sections == ["ppo", "sweep"] and a.processes == 1 and a.deadline == 450
    assert a.ppo_seeds == [1, 256, 4096] and a.sweep_runs == [1, 512, 4096]
    a = b.parse_args(["--device-script", "--smoke", "--ppo-seeds", "2"])
    assert a.sections == ["ppo", "sweep"] and a.ppo_seeds == [2] and a.sweep_runs == [1, 4] and a.total_steps == 2048
    a = b.parse_args(["--sections", "scale", "--scale-runs", "1,8"])
    assert a.scale_runs == [1, 8] and a.deadline is None and a.budget.end is None
    a = b.parse_args(["--sections", "ppo_rnn", "--rnn-seeds", "1,64"])
    assert a.sections == ["ppo_rnn"] and a.rnn_seeds == [1, 64] and b.OWN_REPORT["ppo_rnn"][0] == "recurrent"
    assert b.parse_args(["--smoke"]).rnn_seeds == [1, 4]


def test_scale_steps_shrink_with_the_batch_in_whole_iterations():
    assert scale_steps(1, 2 ** 21, 131072, 512) == 131072  # capped by --total-steps
    assert scale_steps(512, 2 ** 21, 131072, 512) == 4096
    assert scale_steps(4096, 2 ** 21, 131072, 512) == 512
    assert scale_steps(10 ** 6, 2 ** 21, 131072, 512) == 512  # at least one iteration
    assert scale_steps(3, 1000, 10 ** 6, 128) == 256  # rounded down to whole iterations


def test_scale_section_builds_its_runs_at_the_main_jobs_shape():
    """The scale rows: CartPole at PureJaxRL's settings and KeyDoor at the main job's admitted task's
    shape and tuned ppo values, budgets in whole iterations, each config a valid StaticConfig."""
    from _study.bench.workers import static_from

    b = _bench()
    cfgs, budget = b.scale_configs(b.parse_args(["--sections", "scale"]))
    assert [(c["env"], c["runs"]) for c in cfgs] == [(e, n) for e in ("CartPole-v1", "KeyDoor-5x5")
                                                     for n in (1, 64, 512, 4096)]
    keydoor = [c for c in cfgs if c["env"] == "KeyDoor-5x5"]
    static = static_from(keydoor[0]["static"])
    assert (static.num_envs, static.rollout_len, static.total_steps) == (8, 16, budget) and budget == 16384
    from _study.admitted import load_admitted

    tuned = load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))["doorkey5-t60-16k"].tuned["ppo"]
    assert keydoor[0]["hparams"] == pytest.approx(tuned)
    assert all(c["static"]["total_steps"] % (c["static"]["num_envs"] * c["static"]["rollout_len"]) == 0 for c in cfgs)


def test_budget_stops_measurements():
    assert launch.Budget(None).clip(5.0) == 5.0
    try:
        launch.Budget(0).clip(5.0)
    except launch.OutOfTime:
        pass
    else:
        raise AssertionError("a spent budget must raise OutOfTime")
    rows, notes = launch.measure_each([{"kind": "probe"}], 10, launch.Budget(0))
    assert rows == [] and notes and "Not measured" in notes[0]


def test_a_worker_runs_in_a_fresh_process_from_the_study_helpers():
    """``python -m _study.bench.workers`` starts with ``sweeps/`` on the child's path (the launcher
    adds it: the measurements live with the studies, not in the library); here a 64 x 64 probe."""
    res = launch.run_worker({"kind": "probe", "n": 64}, 300)
    assert res["n"] == 64 and res["gflops"] > 0 and res["backend"]


def test_profile_options():
    b = _bench()
    a = b.parse_args(["--sections", "profile", "--profile-static", "fit_batch_episodes=0;fit_batch_episodes=16,"
                      "reward_input=obs", "--profile-lengths", "30,60"])
    assert a.sections == ["profile"] and a.profile_lengths == [30, 60] and a.profile_seeds == 16
    assert a.profile_static == [{"fit_batch_episodes": 0}, {"fit_batch_episodes": 16, "reward_input": "obs"}]
    assert a.profile_methods[0] == "ppo"
    assert {"rrd", "ircr", "q-advantage", "coevo-regression", "hca", "cca", "siop", "icm"} <= set(a.profile_methods)
    a = b.parse_args(["--smoke"])
    assert a.profile_static == [{}] and a.profile_seeds == 2 and a.profile_lengths == [8]
    assert b.OWN_REPORT["profile"][0] == "profile"  # published to DIR/profile.md, apart from benchmarks.md


def test_profile_cache_reuses_rows_of_the_same_settings(tmp_path):
    b = _bench()
    cfg = {"kind": "profile", "method": "rrd", "length": 30, "static": {"fit_batch_episodes": 16},
           "admitted": "/somewhere/admitted_tasks.json"}
    path = tmp_path / "cache.jsonl"
    assert b._profile_cache(str(path)) == {} and b._profile_cache(None) == {}
    path.write_text(json.dumps({"key": b._profile_key(cfg), "result": {"ms": {"update": 1.0}}}) + "\n\n")
    moved = {**cfg, "admitted": "/elsewhere/admitted_tasks.json"}  # the same settings
    assert b._profile_cache(str(path)) == {b._profile_key(moved): {"ms": {"update": 1.0}}}
    assert b._profile_key({**cfg, "static": {"fit_batch_episodes": 8}}) not in b._profile_cache(str(path))

