"""The sweep runner (coevo_jax/sweep.py), its statistics and the sweep CLIs.

One tiny configuration (CartPole-v1, 4 envs x 8 steps, 4 iterations in 2
chunks, a 2-point grid x 2 seeds) is run several ways -- in one process, over
2 worker processes, sharded over 4 forced host devices, stopped and resumed --
and every way must give the same curves. One grid point (``vf_coef = 3e38``)
overflows the loss to non-finite values, so those runs must be flagged as
diverged while the others equal their solo runs. All runs share JAX's
persistent compilation cache, so each program is compiled once per machine.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile

import jax
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax import stats
from coevo_jax.config import ConfigError
from coevo_jax.sweep import (
    Arm,
    SweepConfig,
    SweepError,
    batch_size,
    check_out,
    chunk_length,
    config_text,
    load_result,
    run_sweep,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("COEVO_JAX_TEST_COMPILE_CACHE", os.path.join(tempfile.gettempdir(), "coevo_jax_test_xla_cache"))
STATIC = cj.StaticConfig(method="ppo", num_envs=4, rollout_len=8, total_steps=4 * 8 * 4, hidden_sizes=(16, 16),
                         num_minibatches=2, update_epochs=2)
BAD_VF = 3e38  # inside HParams' range, but the value loss times 3e38 overflows: the run diverges
CONFIG = SweepConfig("CartPole-v1", (Arm(STATIC, {"vf_coef": (0.5, BAD_VF)}),), num_seeds=2, num_chunks=2)
GOOD_RUNS, BAD_RUNS = [0, 1], [2, 3]  # run r: setting r // 2, seed r % 2
# 4 seeds (8 runs) over 4 devices: 2 runs per device, the per-device shape of the reference's batches of 2;
# its runs 0, 1 (setting 0) and 4, 5 (setting 1) have the keys and HParams of the reference's runs 0..3
SHARDED_CONFIG = dataclasses.replace(CONFIG, num_seeds=4)
SHARDED_AS_REFERENCE = [0, 1, 4, 5]

SHARDED_SCRIPT = """
import sys, json
sys.path.insert(0, {root!r})
import jax
from coevo_jax.sweep import SweepConfig, run_sweep
config = SweepConfig.from_json(json.loads(open({cfg!r}).read()))
res = run_sweep(config, {out!r}, processes=1, max_parallel=8, progress=False, compile_cache={cache!r})
print("devices", len(jax.local_devices()), res.info["devices_per_process"])
"""


def _assert_same_curves(a: dict, b: dict, exact: bool = True):
    assert sorted(a) == sorted(b)
    for name in a:
        if exact:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        else:
            # atol: float32 means over a 512-step minibatch of mixed-sign terms ~1e-2 carry ~1e-8..1e-7 of
            # summation-order noise (seen: 1.1e-8 on a policy_loss of 2.3e-5)
            np.testing.assert_allclose(a[name], b[name], rtol=2e-5, atol=1e-7, err_msg=name)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("sweeps"))


@pytest.fixture(scope="module")
def sharded_job(workdir):
    """Start the 4-device run in a subprocess first, so its compile overlaps the in-process tests."""
    cfg = os.path.join(workdir, "sharded_config.json")
    with open(cfg, "w") as f:
        f.write(config_text(SHARDED_CONFIG))
    out = os.path.join(workdir, "sharded")
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
                        " --xla_cpu_enable_concurrency_optimized_scheduler=false").strip()
    script = SHARDED_SCRIPT.format(root=ROOT, cfg=cfg, out=out, cache=CACHE)
    proc = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    yield proc, out
    if proc.poll() is None:
        proc.kill()


@pytest.fixture(scope="module")
def reference(workdir, sharded_job):
    """The uninterrupted in-process sweep (2 runs per batch)."""
    return run_sweep(CONFIG, os.path.join(workdir, "reference"), processes=1, max_parallel=2, progress=False,
                     compile_cache=CACHE)


@pytest.fixture(scope="module")
def solo():
    """``make_train`` runs with the same keys and hyperparameters as the sweep's good runs."""
    env, p = envs_jax.make("CartPole-v1")
    prev = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", CACHE)
    try:
        train = jax.jit(cj.make_train(STATIC, env, p))
        hp = cj.default_hparams("ppo", vf_coef=0.5)
        out = [train(jax.random.fold_in(jax.random.PRNGKey(0), seed), hp) for seed in range(2)]
    finally:
        jax.config.update("jax_compilation_cache_dir", prev)
    return [jax.device_get(m) for _, m in out], [s for s, _ in out]


# ----------------------------------------------------------------------------- equivalences
def test_sweep_runs_equal_solo_runs_and_divergence_is_isolated(reference, solo):
    metrics, states = solo
    res = reference
    assert res.curves["episode_return"].shape == (4, STATIC.num_iterations)
    np.testing.assert_array_equal(res.runs["seed"], [0, 1, 0, 1])
    np.testing.assert_array_equal(res.runs["hp/vf_coef"], np.float32([0.5, 0.5, BAD_VF, BAD_VF]))  # HParams are f32
    for seed, run in enumerate(GOOD_RUNS):
        for name, solo_curve in metrics[seed].items():
            np.testing.assert_allclose(res.curves[name][run], solo_curve, rtol=2e-5, atol=2e-6, err_msg=name)
        assert not bool(states[seed].diverged)
    # the absurd grid point diverged (flagged, frozen) and only it
    np.testing.assert_array_equal(res.runs["diverged"], [False, False, True, True])
    np.testing.assert_array_equal(res.curves["diverged"][:, -1], [0.0, 0.0, 1.0, 1.0])
    good, bad = res.summary  # one row per setting, in grid order
    assert good["vf_coef"] == 0.5 and bad["vf_coef"] == pytest.approx(BAD_VF)
    assert good["n_diverged"] == 0 and bad["n_diverged"] == 2
    assert good["n_seeds"] == 2 and good["method"] == "ppo" and good["env"] == "CartPole-v1"
    # the summary's final return is the mean of the last 10% (here: the last) iteration, IQM over seeds
    finals = res.curves["episode_return"][GOOD_RUNS, -1]
    assert good["final_return_mean"] == pytest.approx(finals.mean())
    assert good["final_return_iqm"] == pytest.approx(stats.iqm(finals))
    assert good["final_return_ci_low"] <= good["final_return_iqm"] <= good["final_return_ci_high"]


def test_output_folder_contents(reference):
    out = reference.out
    for name in ("config.json", "summary.csv", "curves.npz", "run_info.json", "FINISHED", "learning_curves.png",
                 "final_return_vs_vf_coef.png"):
        assert os.path.exists(os.path.join(out, name)), name
    back = load_result(out)
    _assert_same_curves(back.curves, reference.curves)
    header = open(os.path.join(out, "summary.csv")).readline().strip().split(",")
    for col in ("env", "method", "k", "n_seeds", "n_diverged", "final_return_mean", "final_return_iqm",
                "final_return_ci_low", "final_return_ci_high", "final_success_mean", "steps_to_threshold_median",
                "vf_coef"):
        assert col in header, col
    # config.json is enough to rerun: it round-trips to the same config
    text = open(os.path.join(out, "config.json")).read()
    assert config_text(SweepConfig.from_json(json.loads(text))) == text
    assert not [f for f in os.listdir(out) if ".tmp" in f]  # no half-written files left


def test_two_worker_processes_equal_one_process(reference, workdir, monkeypatch):
    # the workers' XLA flags only change speed, not results (single-threaded Eigen gives the same bits);
    # using this process's flags lets the workers reuse the reference run's compiled program from the cache
    monkeypatch.setenv("COEVO_JAX_WORKER_XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))
    res = run_sweep(CONFIG, os.path.join(workdir, "two_procs"), processes=2, max_parallel=4, progress=False,
                    compile_cache=CACHE)
    assert res.info["processes_per_host"] == 2 and set(res.info["workers"]) == {"0", "1"}
    _assert_same_curves(res.curves, reference.curves)


def test_stop_and_resume_equals_uninterrupted_and_mismatch_is_refused(reference, workdir):
    out = os.path.join(workdir, "resume")
    assert run_sweep(CONFIG, out, processes=1, max_parallel=2, stop_after_chunks=1, progress=False,
                     compile_cache=CACHE) is None
    assert not os.path.exists(os.path.join(out, "FINISHED"))
    assert os.path.isdir(os.path.join(out, "checkpoints", "w0", "a0_b0", "1"))  # orbax step 1 of batch 0
    # a different config is refused (one line, naming the mismatch) and nothing is touched
    other = dataclasses.replace(CONFIG, num_seeds=3)
    with pytest.raises(SweepError, match="different config") as e:
        run_sweep(other, out, processes=1, max_parallel=2, progress=False, compile_cache=CACHE)
    assert "\n" not in str(e.value)
    # a checkpoint whose stored hash does not match is refused by the worker too
    forged = os.path.join(workdir, "forged")
    shutil.copytree(out, forged)
    with open(os.path.join(forged, "config.json"), "w") as f:
        f.write(config_text(other))
    with pytest.raises(SweepError, match="different config"):
        run_sweep(other, forged, processes=1, max_parallel=2, progress=False, compile_cache=CACHE)
    # rerunning the same command resumes and ends exactly where the uninterrupted run did
    res = run_sweep(CONFIG, out, processes=1, max_parallel=2, progress=False, compile_cache=CACHE)
    _assert_same_curves(res.curves, reference.curves)
    assert os.path.exists(os.path.join(out, "FINISHED"))


def test_sharded_over_four_devices_equals_unsharded(reference, sharded_job):
    proc, out = sharded_job
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, text[-2000:]
    assert "devices 4 4" in text
    res = load_result(out)
    assert res.info["devices_per_process"] == 4
    sharded = {k: v[SHARDED_AS_REFERENCE] for k, v in res.curves.items()}
    # the learning outcome is bit-identical; the SPMD-partitioned program may sum a few
    # per-minibatch diagnostics (approx_kl, policy_loss) in another order (seen: 1e-9 to 1.1e-8 absolute)
    _assert_same_curves({k: sharded[k] for k in ("episode_return", "env_steps", "diverged")},
                        {k: reference.curves[k] for k in ("episode_return", "env_steps", "diverged")})
    _assert_same_curves(sharded, reference.curves, exact=False)


MULTIHOST_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from coevo_jax.sweep import SweepConfig, run_sweep
import json
config = SweepConfig.from_json(json.loads(open({cfg!r}).read()))
res = run_sweep(config, {out!r}, processes=1, max_parallel=2, progress=False, compile_cache={cache!r},
                distributed=dict(coordinator_address="localhost:{port}", num_processes=2, process_id={pid}))
print("host", {pid}, "wrote results" if res is not None else "left the results to process 0")
"""


@pytest.mark.skipif(os.environ.get("COEVO_JAX_MULTIHOST_TEST") != "1",
                    reason="two jax.distributed processes (~1-2 min); set COEVO_JAX_MULTIHOST_TEST=1")
def test_two_hosts_with_jax_distributed_equal_one_process(reference, workdir):
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    cfg = os.path.join(workdir, "multihost_config.json")
    with open(cfg, "w") as f:
        f.write(config_text(CONFIG))
    out = os.path.join(workdir, "multihost")
    procs = [subprocess.Popen([sys.executable, "-c", MULTIHOST_SCRIPT.format(
        root=ROOT, cfg=cfg, out=out, cache=CACHE, port=port, pid=i)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for i in range(2)]
    texts = [p.communicate(timeout=900)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), [t[-1500:] for t in texts]
    assert "host 0 wrote results" in texts[0] and "host 1 left the results to process 0" in texts[1]
    res = load_result(out)
    assert res.info["num_hosts"] == 2 and set(res.info["workers"]) == {"0", "1"}
    _assert_same_curves(res.curves, reference.curves)


# ----------------------------------------------------------------------------- refusals
def test_finished_folder_is_refused_without_overwrite(reference):
    with pytest.raises(SweepError, match="finished sweep; pass --overwrite"):
        run_sweep(CONFIG, reference.out, processes=1, progress=False)
    assert check_out(reference.out, config_text(CONFIG), overwrite=True) == "wipe"
    assert os.path.exists(os.path.join(reference.out, "FINISHED"))  # check_out writes nothing


def test_bad_configs_rejected_before_anything_is_written(tmp_path):
    out = str(tmp_path / "never")
    cases = [
        (SweepConfig("CartPole-v1", (Arm(STATIC, {"k": (0, 4)}),), num_seeds=2), "HParams.k=0"),
        (SweepConfig("CartPole-v1", (Arm(STATIC, {"lr": (1e6,)}),), num_seeds=2), "HParams.lr"),
        (SweepConfig("CartPole-v1", (Arm(STATIC, {"nope": (1,)}),), num_seeds=2), "unknown HParams field 'nope'"),
        (SweepConfig("NoSuchEnv", (Arm(STATIC),), num_seeds=2), "unknown environment 'NoSuchEnv'"),
        (SweepConfig("CartPole-v1", (Arm(STATIC.replace(total_steps=-1)),), num_seeds=2), "total_steps=-1"),
        (SweepConfig("CartPole-v1", (Arm(STATIC),), num_seeds=0), "num_seeds=0"),
    ]
    for config, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            run_sweep(config, out, progress=False)
        assert not os.path.exists(out)


# ----------------------------------------------------------------------------- the main job's CLI
def _k_sensitivity():
    sys.path.insert(0, os.path.join(ROOT, "sweeps"))
    try:
        import k_sensitivity
    finally:
        sys.path.pop(0)
    return k_sensitivity


@pytest.mark.parametrize("argv, msg", [
    (["--k", "0"], "K=0"),
    (["--k", "4,-1"], "K=-1"),
    (["--methods", "ppo,nonsense"], "unknown method 'nonsense'"),
    (["--env", "NoSuchEnv"], "unknown environment 'NoSuchEnv'"),
    (["--total-steps", "-5"], "--total-steps=-5"),
    (["--num-seeds", "0"], "--num-seeds=0"),
    (["--max-parallel", "0"], "--max-parallel=0"),
])
def test_k_sensitivity_bad_input_one_line_no_folder(argv, msg, tmp_path, capsys):
    out = str(tmp_path / "ks")
    assert _k_sensitivity().main(argv + ["--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and err.startswith("k_sensitivity.py: error:")
    assert not os.path.exists(out)


def test_k_sensitivity_cli_exit_code_in_a_subprocess(tmp_path):
    out = str(tmp_path / "ks")
    p = subprocess.run([sys.executable, os.path.join(ROOT, "sweeps", "k_sensitivity.py"), "--k", "0", "--out", out],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "K=0" in p.stderr
    assert not os.path.exists(out)


def test_k_sensitivity_help_lists_every_option_with_default():
    parser = _k_sensitivity().build_parser()
    text = parser.format_help()
    for action in parser._actions:
        if action.dest == "help":
            continue
        assert action.option_strings[0] in text
        assert "default" in (action.help or ""), action.option_strings[0]


def test_k_sensitivity_default_config_has_at_least_300_runs():
    ks = _k_sensitivity()
    args = ks.build_parser().parse_args([])
    config = ks.build_config(args, [])
    runs = sum(config.num_seeds * max(1, len(a.settings())) for a in config.arms)
    assert runs >= 300
    assert config.env == "KeyDoor-5x5"
    swept = [a for a in config.arms if a.grid]
    assert all(tuple(a.grid["k"]) == (1, 2, 4, 8, 16, 64) for a in swept)
    # every K refits at least twice within the default budget
    assert all(a.static.num_iterations >= 2 * 64 for a in config.arms)


# ----------------------------------------------------------------------------- small pure pieces
def test_chunk_length_and_batch_size():
    assert chunk_length(128, 8) == 16
    assert chunk_length(4, 2) == 2
    assert chunk_length(12, 5) == 2  # divisors of 12 nearest 12/5 = 2.4 in log ratio: 2 (0.18) beats 3 (0.22)
    assert chunk_length(7, 3) == 1  # a prime count: 1 (log ratio 0.85 to 7/3) beats 7 (1.10)
    assert batch_size(10, 2, 3, 1) == 3  # 5 runs per worker in 2 batches of 3 (the last padded)
    assert batch_size(10, 2, 3, 4) == 4  # rounded up to the device count
    assert batch_size(4, 1, None, 1) == 4


def test_sustained_steps_to_threshold_ignores_early_flukes():
    steps = np.arange(1, 9) * 100.0
    # an early lucky success (iterations 0-1), a dip, then a rise that stays
    curve = np.array([0.9, 0.9, 0.0, 0.0, 0.6, 0.7, 0.8, 0.8])
    assert float(stats.steps_to_sustained_threshold(curve, steps, 0.5, window=1)) == 500.0
    # window 2, weights = episodes: at iteration 4 the mean is (0*1 + 0.6*3) / 4 = 0.45 < 0.5,
    # from iteration 5 on (0.6*3 + 0.7*1) / 4 = 0.625 and up
    episodes = np.array([1, 1, 1, 1, 3, 1, 1, 1])
    assert float(stats.steps_to_sustained_threshold(curve, steps, 0.5, window=2, weights=episodes)) == 600.0
    np.testing.assert_allclose(stats.trailing_mean(curve, 2, episodes)[4], 0.45)
    assert float(stats.steps_to_sustained_threshold(curve[:6] * 0, steps[:6], 0.5, window=1)) == np.inf
    # a batch of runs [R, I] gives one number per run
    both = stats.steps_to_sustained_threshold(np.stack([curve, curve * 0]), steps, 0.5, window=1)
    np.testing.assert_array_equal(both, [500.0, np.inf])


def test_stats_helpers_against_hand_values():
    curve = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 12.0]])
    # last 10% of 12 iterations = ceil(1.2) = 2 iterations: (10 + 12) / 2
    assert stats.tail_fraction_mean(curve, 0.1)[0] == pytest.approx(11.0)
    # last 25% = 3 iterations: var([9, 10, 12]) = 14/9 (population variance)
    assert stats.tail_fraction_variance(curve, 0.25)[0] == pytest.approx(14.0 / 9.0)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 5))
    x[2, 1] = np.nan
    np.testing.assert_allclose(stats.iqm_along(x, 0), [stats.iqm(x[:, j]) for j in range(5)])
    point, lo, hi = stats.bootstrap_curve_ci(x[:, [0, 2]], "iqm", n_boot=200)
    assert np.all(lo <= point + 1e-12) and np.all(point <= hi + 1e-12)
    assert stats.median_steps([1.0, np.inf, np.inf]) == np.inf


def test_probability_of_improvement_reference_values():
    # P(X > Y) over all pairs, ties count half: (1>0) (1<3) (2>0) (2<3) -> 2/4; with a tie 1 == 1 -> (1 + 0.5) / 2
    assert stats.probability_of_improvement([1.0, 2.0], [0.0, 3.0], n_boot=50)["p"] == pytest.approx(0.5)
    assert stats.probability_of_improvement([1.0], [0.0, 1.0], n_boot=50)["p"] == pytest.approx(0.75)
    out = stats.probability_of_improvement(np.arange(16.0) + 8, np.arange(16.0), n_boot=300)
    assert out["ci_low"] <= out["p"] <= out["ci_high"] and out["p"] > 0.7
