"""The experiment runner (coevo_jax/experiment/) and the main job's CLI.

One tiny configuration (a 4-step DelayedChain with noise rewards on every
step, 4 envs x 8 steps, 4 iterations in 2 chunks, a 2-point grid x 2 seeds)
is run several ways -- on one device, split over 2 and 4 forced host devices
(killed with -9 and resumed), stopped and resumed, over two hosts -- and every
way must give the same curves. One grid point (``vf_coef = 3e38``)
overflows the loss to non-finite values, so those runs must be flagged as
diverged while the others equal their solo runs. All runs share JAX's
persistent compilation cache, so each program is compiled once per machine
(JAX lets only ``jax.distributed`` process 0 write to it: process 1 compiles).
The runs on several devices happen in subprocesses (a process chooses its CPU
device count before its first computation).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import jax
import numpy as np
import pytest

import coevo_jax as cj
import envs_jax
from coevo_jax.analysis import stats
from coevo_jax.analysis.metrics import final_score
from coevo_jax.analysis.report import load_report, rebuild_report, write_report
from coevo_jax.config import ConfigError
from coevo_jax.experiment import Arm, Study, StudyError, load_result, run_study
from coevo_jax.experiment.folder import check_out
from coevo_jax.experiment.plan import batch_size
from coevo_jax.experiment.spec import chunk_length, config_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CACHE = os.environ.get("COEVO_JAX_TEST_COMPILE_CACHE", os.path.join(tempfile.gettempdir(), "coevo_jax_test_xla_cache"))
STATIC = cj.StaticConfig(method="ppo", num_envs=4, rollout_len=8, total_steps=4 * 8 * 4, hidden_sizes=(16, 16),
                         num_minibatches=2, update_epochs=2)
BAD_VF = 3e38  # inside HParams' range, but the value loss times 3e38 overflows: the run diverges
# an envs_jax task: the subprocesses started here import no gymnax (seconds each); noise rewards on every
# step give the value loss a magnitude that BAD_VF overflows
ENV, ENV_KWARGS = "DelayedChain", {"length": 4}
CONFIG = Study(ENV, (Arm(STATIC, {"vf_coef": (0.5, BAD_VF)}),), num_seeds=2, num_chunks=2, threshold=1.0,
               threshold_metric="episode_return", save_final=True, save_chunks=True, env_kwargs=ENV_KWARGS)
GOOD_RUNS, BAD_RUNS = [0, 1], [2, 3]  # run r: setting r // 2, seed r % 2
# 4 seeds (8 runs) over 4 devices: 2 runs per device, the per-device shape of the reference's batches of 2;
# its runs 0, 1 (setting 0) and 4, 5 (setting 1) have the keys and HParams of the reference's runs 0..3
SHARDED_CONFIG = dataclasses.replace(CONFIG, num_seeds=4)
SHARDED_AS_REFERENCE = [0, 1, 4, 5]

SHARDED_SCRIPT = """
import sys, json
sys.path.insert(0, {root!r})
import jax
from coevo_jax.experiment import Study, run_study
config = Study.from_json(json.loads(open({cfg!r}).read()))
res = run_study(config, {out!r}, devices={devices}, max_parallel={max_parallel}, progress=False,
                compile_cache={cache!r})
print("devices", len(jax.local_devices()), res.info["devices_per_host"])
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


def _devices_job(workdir, name, config, devices, max_parallel):
    """``run_study`` of ``config`` on ``devices`` host devices in a subprocess (its own output folder)."""
    cfg = os.path.join(workdir, f"{name}_config.json")
    with open(cfg, "w") as f:
        f.write(config_text(config))
    out = os.path.join(workdir, name)
    script = SHARDED_SCRIPT.format(root=ROOT, cfg=cfg, out=out, cache=CACHE, devices=devices,
                                   max_parallel=max_parallel)
    return subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True), out


@pytest.fixture(scope="module")
def sharded_job(workdir):
    """Start the 4-device run in a subprocess first, so its compile overlaps the in-process tests."""
    proc, out = _devices_job(workdir, "sharded", SHARDED_CONFIG, 4, 8)
    yield proc, out
    if proc.poll() is None:
        proc.kill()


@pytest.fixture(scope="module")
def reference(workdir, sharded_job):
    """The uninterrupted in-process sweep (2 runs per batch), with its report."""
    res = run_study(CONFIG, os.path.join(workdir, "reference"), max_parallel=2, progress=False,
                    compile_cache=CACHE)
    assert not os.path.exists(os.path.join(res.out, "summary.csv"))  # the runner computes no statistics
    return write_report(res)


@pytest.fixture(scope="module")
def solo():
    """``make_train`` runs with the same keys and hyperparameters as the sweep's good runs."""
    env, p = envs_jax.make(ENV, **ENV_KWARGS)
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
    assert good["n_seeds"] == 2 and good["method"] == "ppo" and good["env"] == ENV
    # the summary's final return: episodes finished in the last 10% of env steps (here: the last iteration)
    finals = res.curves["episode_return"][GOOD_RUNS, -1]
    np.testing.assert_allclose(final_score(res.curves["episode_return"][GOOD_RUNS], res.curves["episodes"][GOOD_RUNS],
                                           res.curves["env_steps"][0]), finals, rtol=1e-6)
    assert good["final_return_mean"] == pytest.approx(finals.mean())
    assert good["final_return_iqm"] == pytest.approx(stats.iqm(finals))
    assert good["final_return_ci_low"] <= good["final_return_iqm"] <= good["final_return_ci_high"]


def test_output_folder_contents(reference):
    out = reference.out
    for name in ("config.json", "summary.csv", "curves.npz", "run_info.json", "FINISHED", "learning_curves.png",
                 "final_return_vs_vf_coef.png"):
        assert os.path.exists(os.path.join(out, name)), name
    back = load_report(out)
    _assert_same_curves(back.curves, reference.curves)
    expected = [{k: pytest.approx(v, rel=1e-5, nan_ok=True) if isinstance(v, float) else v for k, v in row.items()}
                for row in reference.summary]
    assert back.summary == expected  # summary.csv read back (6 significant digits)
    os.remove(os.path.join(out, "summary.csv"))  # a kill between FINISHED and the report: loading rebuilds it
    assert load_report(out).summary == expected
    assert rebuild_report(out).summary == expected  # recomputed from curves.npz: the same rows
    header = open(os.path.join(out, "summary.csv")).readline().strip().split(",")
    for col in ("env", "arm", "method", "n_seeds", "n_diverged", "final_return_mean", "final_return_iqm",
                "final_return_ci_low", "final_return_ci_high", "final_success_iqm", "auc_return_iqm",
                "steps_to_threshold_median", "reached_fraction", "steps_resolution", "vf_coef"):
        assert col in header, col
    # config.json is enough to rerun: it round-trips to the same config
    text = open(os.path.join(out, "config.json")).read()
    assert config_text(Study.from_json(json.loads(text))) == text
    assert not [f for f in os.listdir(out) if ".tmp" in f]  # no half-written files left


def test_two_devices_killed_and_resumed_on_four_equal_one_device(reference, workdir):
    """The whole batch of 4 runs split over 2 devices (2 each, the reference's per-device shape), the
    process killed with -9 once a checkpoint is on disk, then the same call on 4 devices (the same batch,
    one run each): it resumes to the reference's results."""
    proc, out = _devices_job(workdir, "two_devices", CONFIG, 2, 4)
    step1 = os.path.join(out, "checkpoints", "a0_b0", "1")  # orbax renames a step's folder when complete
    deadline = time.time() + 600
    while not os.path.isdir(step1) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -9 and os.path.isdir(step1) and not os.path.exists(os.path.join(out, "FINISHED"))
    proc, out = _devices_job(workdir, "two_devices", CONFIG, 4, 4)
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0 and "devices 4 4" in text, text[-2000:]
    res = load_result(out)
    assert res.info["devices_per_host"] == 4
    # as on 4 devices (below): the outcome bit for bit, per-minibatch diagnostics to rounding
    _assert_same_curves({k: res.curves[k] for k in ("episode_return", "env_steps", "diverged")},
                        {k: reference.curves[k] for k in ("episode_return", "env_steps", "diverged")})
    _assert_same_curves(res.curves, reference.curves, exact=False)


def test_stop_and_resume_equals_uninterrupted_and_mismatch_is_refused(reference, workdir):
    out = os.path.join(workdir, "resume")
    assert run_study(CONFIG, out, max_parallel=2, stop_after_chunks=1, progress=False,
                     compile_cache=CACHE) is None
    assert not os.path.exists(os.path.join(out, "FINISHED"))
    assert os.path.isdir(os.path.join(out, "checkpoints", "a0_b0", "1"))  # orbax step 1 of batch 0
    # a different config is refused (one line, naming the mismatch) and nothing is touched
    other = dataclasses.replace(CONFIG, num_seeds=3)
    with pytest.raises(StudyError, match="different config") as e:
        run_study(other, out, max_parallel=2, progress=False, compile_cache=CACHE)
    assert "\n" not in str(e.value)
    # a checkpoint whose stored hash does not match is refused by the worker too
    forged = os.path.join(workdir, "forged")
    shutil.copytree(out, forged)
    with open(os.path.join(forged, "config.json"), "w") as f:
        f.write(config_text(other))
    with pytest.raises(StudyError, match="different config"):
        run_study(other, forged, max_parallel=2, progress=False, compile_cache=CACHE)
    # other batches (4 runs each, not 2) are refused by name, and nothing is touched
    with pytest.raises(StudyError, match=r"holds runs \[0, 1\] in batches of 2, not \[0, 1, 2, 3\] in batches of 4"):
        run_study(CONFIG, out, max_parallel=4, progress=False, compile_cache=CACHE)
    # rerunning the same command resumes and ends exactly where the uninterrupted run did
    res = run_study(CONFIG, out, max_parallel=2, progress=False, compile_cache=CACHE)
    _assert_same_curves(res.curves, reference.curves)
    assert os.path.exists(os.path.join(out, "FINISHED"))
    # the state snapshot saved before the interruption and the one after it equal the uninterrupted run's
    for chunk in (1, 2):
        for a, b in zip(jax.tree.leaves(res.chunk_states("ppo", chunk)),
                        jax.tree.leaves(reference.chunk_states("ppo", chunk))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_sharded_over_four_devices_equals_unsharded(reference, sharded_job):
    proc, out = sharded_job
    text, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, text[-2000:]
    assert "devices 4 4" in text
    res = load_result(out)
    assert res.info["devices_per_host"] == 4
    sharded = {k: v[SHARDED_AS_REFERENCE] for k, v in res.curves.items()}
    # the learning outcome is bit-identical; the SPMD-partitioned program may sum a few
    # per-minibatch diagnostics (approx_kl, policy_loss) in another order (seen: 1e-9 to 1.1e-8 absolute)
    _assert_same_curves({k: sharded[k] for k in ("episode_return", "env_steps", "diverged")},
                        {k: reference.curves[k] for k in ("episode_return", "env_steps", "diverged")})
    _assert_same_curves(sharded, reference.curves, exact=False)


MULTIHOST_SCRIPT = """
import sys
sys.path.insert(0, {root!r})
from coevo_jax.experiment import Study, run_study
import json
config = Study.from_json(json.loads(open({cfg!r}).read()))
res = run_study(config, {out!r}, max_parallel=2, progress=False, compile_cache={cache!r},
                distributed=dict(coordinator_address="localhost:{port}", num_processes=2, process_id={pid}))
print("host", {pid}, "wrote results" if res is not None else "left the results to process 0")
"""


def test_two_hosts_with_jax_distributed_equal_one_process(reference, workdir):
    """Two hosts, each a subprocess (``jax.distributed`` starts before a process's first computation)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        port = sock.getsockname()[1]
    cfg = os.path.join(workdir, "multihost_config.json")
    with open(cfg, "w") as f:
        f.write(config_text(CONFIG))
    out = os.path.join(workdir, "multihost")
    hosts = [subprocess.Popen([sys.executable, "-c", MULTIHOST_SCRIPT.format(
        root=ROOT, cfg=cfg, out=out, cache=CACHE, port=port, pid=pid)], stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True) for pid in (0, 1)]
    try:
        texts = [h.communicate(timeout=900)[0] for h in hosts]
    finally:
        for h in hosts:
            h.kill()
    assert [h.returncode for h in hosts] == [0, 0], texts[0][-1500:] + texts[1][-1500:]
    assert "host 0 wrote results" in texts[0] and "host 1 left the results to process 0" in texts[1]
    res = load_result(out)
    assert res.info["num_hosts"] == 2 and set(res.info["hosts"]) == {"0", "1"}
    # one device per host: as on several devices of one host, the outcome bit for bit, diagnostics to rounding
    _assert_same_curves({k: res.curves[k] for k in ("episode_return", "env_steps", "diverged")},
                        {k: reference.curves[k] for k in ("episode_return", "env_steps", "diverged")})
    _assert_same_curves(res.curves, reference.curves, exact=False)


# ----------------------------------------------------------------------------- refusals
def test_finished_folder_is_refused_without_overwrite(reference):
    with pytest.raises(StudyError, match="finished study; pass --overwrite"):
        run_study(CONFIG, reference.out, progress=False)
    assert check_out(reference.out, config_text(CONFIG), overwrite=True) == "wipe"
    assert os.path.exists(os.path.join(reference.out, "FINISHED"))  # check_out writes nothing


def test_final_states_are_the_solo_runs_final_states(reference, solo):
    _, states = solo
    final = reference.final_states("ppo")
    for seed, run in enumerate(GOOD_RUNS):
        for a, b in zip(jax.tree.leaves(jax.tree.map(lambda x: x[run], final)), jax.tree.leaves(states[seed])):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)


def test_chunk_states_end_at_the_final_states_and_differ_over_training(reference):
    final, first, last = (reference.final_states("ppo"), reference.chunk_states("ppo", 1),
                          reference.chunk_states("ppo", 2))
    for a, b in zip(jax.tree.leaves(last), jax.tree.leaves(final)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(np.asarray(first.iteration), 2)  # 4 iterations in 2 chunks
    assert not np.allclose(jax.tree.leaves(first.params)[0], jax.tree.leaves(last.params)[0])
    with pytest.raises(StudyError, match="after chunk 3"):
        reference.chunk_states("ppo", 3)
    with pytest.MonkeyPatch.context() as mp:  # a folder named relative to the working directory reads the same
        mp.chdir(os.path.dirname(reference.out))
        again = load_result(os.path.basename(reference.out)).chunk_states("ppo", 1)
    for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(first)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_version_3_config_reads_back_with_its_methods_fields_only(workdir):
    """A version-3 ``config.json`` (every method's static fields flat in each arm) reads back: each arm
    keeps its method's fields (the others dropped), so a published folder still loads; it is written
    back as version 4 (flat, the method's fields only), and resuming such a folder is refused."""
    from coevo_jax.experiment.spec import CONFIG_VERSION

    siop = cj.static_config("siop", num_envs=4, rollout_len=8, total_steps=64, ensemble_size=2)
    study = Study("KeyDoor-5x5", (Arm(STATIC, {"vf_coef": (0.5,)}), Arm(siop, fixed={"k": 2})), num_seeds=2)
    d = json.loads(config_text(study))
    assert CONFIG_VERSION == 4 and d["version"] == 4 and "reward_steps" not in d["arms"][1]["static"]
    assert set(d["arms"][1]["static"]) == set(siop.as_dict()) and "ensemble_size" not in d["arms"][0]["static"]
    # version 3 wrote every field of the old StaticConfig in each arm
    old_fields = dict(reward_hidden=[64, 64], action_embed_dim=16, reward_steps=4, buffer_episodes=None,
                      max_episode_len=None, reward_input="features", potential_hidden=[64, 64], potential_steps=4,
                      potential_layernorm=False, potential_buffer_episodes=64, potential_episode_len=None,
                      ensemble_size=1, ensemble_combine="mean", refit_steps_per_k=False, credit_nstep=1,
                      icm_feature_dim=32, meta_inner_steps=1, meta_truncate=0)
    for arm in d["arms"]:
        arm["static"] = {**old_fields, **arm["static"]}
    d["version"] = 3
    back = Study.from_json(d)
    assert [a.static for a in back.arms] == [a.static for a in study.arms] and back.arms[1].static.signal == siop.signal
    assert config_text(back) == config_text(study)  # written back as version 4
    # a finished version-3 folder loads; an unfinished one is not resumed
    old = os.path.join(workdir, "version3")
    os.makedirs(os.path.join(old, "checkpoints"))
    with open(os.path.join(old, "config.json"), "w") as f:
        json.dump(d, f)
    with pytest.raises(StudyError, match=r"^.*version3 was written by an older version of coevo_jax.experiment"
                                         r" \(config.json version 3, now 4\) and cannot be resumed; use a new --out$"):
        check_out(old, config_text(study), overwrite=False)
    assert check_out(old, config_text(study), overwrite=True) == "wipe"
    for name in ("FINISHED", "summary.csv"):
        with open(os.path.join(old, name), "w") as f:
            f.write("arm,method\nppo,ppo\n" if name == "summary.csv" else "done\n")
    np.savez(os.path.join(old, "curves.npz"), **{"metric/episode_return": np.zeros((2, 2))})
    assert config_text(load_result(old).study) == config_text(study)


def test_methods_that_ride_on_another_programs_get_its_program_key():
    """``dense`` keys to ``ppo``'s program and ``coevo-ranking`` to ``coevo-regression``'s, so a worker
    compiles each once; methods with their own program (siop) keep their own key."""
    from coevo_jax.experiment.plan import build_plan
    from coevo_jax.experiment.worker import program_key

    static = cj.StaticConfig(num_envs=4, rollout_len=8, total_steps=64, update_epochs=1, num_minibatches=1)
    methods = ("ppo", "dense", "coevo-regression", "coevo-ranking", "siop")
    study = Study("KeyDoor-5x5", tuple(Arm(dataclasses.replace(static, method=m)) for m in methods), num_seeds=2)
    keys = dict(zip(methods, (program_key(plan, 2) for plan in build_plan(study, check_trainers=False))))
    assert keys["dense"] == keys["ppo"] and keys["coevo-ranking"] == keys["coevo-regression"]
    assert len({keys[m] for m in ("ppo", "coevo-regression", "siop")}) == 3


def test_arms_differing_only_in_hparam_values_share_one_compiled_program(reference, workdir):
    """A second arm with the same static config and batch shape (siop and siop-norm in the main
    job) runs the program compiled for the first (0 s compiling) and gives its own runs' results."""
    twin = Study(ENV, (Arm(STATIC, fixed={"vf_coef": 0.5}), Arm(STATIC, fixed={"vf_coef": 0.5}, label="twin")),
                 num_seeds=2, num_chunks=2, threshold=1.0, threshold_metric="episode_return", env_kwargs=ENV_KWARGS)
    res = run_study(twin, os.path.join(workdir, "twin"), max_parallel=2, progress=False, compile_cache=CACHE)
    compile_s = res.info["hosts"]["0"]["compile_s"]
    assert compile_s["twin"] == 0.0 and compile_s["ppo"] > 0.0
    ppo, copy = (res.runs["label"] == "ppo"), (res.runs["label"] == "twin")
    for name in ("episode_return", "loss"):
        np.testing.assert_array_equal(res.curves[name][copy], res.curves[name][ppo])
        np.testing.assert_array_equal(res.curves[name][ppo], reference.curves[name][GOOD_RUNS])


def test_unwritable_out_is_one_line_error(tmp_path, capsys):
    # a folder that cannot be created (its parent is a file: refused even for root, unlike a read-only mode)
    parent = tmp_path / "a_file"
    parent.write_text("")
    with pytest.raises(StudyError, match="cannot write to --out") as e:
        run_study(CONFIG, str(parent / "out"), progress=False)
    assert "\n" not in str(e.value)
    assert _k_sensitivity().main(["--out", str(parent / "ks"), "--k", "1", "--num-seeds", "1", "--methods", "ppo"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot write to --out" in err


def test_bad_configs_rejected_before_anything_is_written(tmp_path):
    out = str(tmp_path / "never")
    cases = [
        (Study("CartPole-v1", (Arm(STATIC, {"k": (0, 4)}),), num_seeds=2), "HParams.k=0"),
        (Study("CartPole-v1", (Arm(STATIC, {"lr": (1e6,)}),), num_seeds=2), "HParams.lr"),
        (Study("CartPole-v1", (Arm(STATIC, {"nope": (1,)}),), num_seeds=2), "unknown HParams field 'nope'"),
        (Study("NoSuchEnv", (Arm(STATIC),), num_seeds=2), "unknown environment 'NoSuchEnv'"),
        (Study("CartPole-v1", (Arm(STATIC.replace(total_steps=-1)),), num_seeds=2), "total_steps=-1"),
        (Study("CartPole-v1", (Arm(STATIC),), num_seeds=0), "num_seeds=0"),
    ]
    for config, msg in cases:
        with pytest.raises(ConfigError, match=msg):
            run_study(config, out, progress=False)
        assert not os.path.exists(out)
    # this process's CPU backend runs with its devices already: more cannot be made now, and it says so
    with pytest.raises(ConfigError, match=r"devices=2: this process has 1 cpu device\(s\)"):
        run_study(CONFIG, out, devices=2, progress=False)
    with pytest.raises(ConfigError, match="devices=0 must be an integer >= 1"):
        run_study(CONFIG, out, devices=0, progress=False)
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
    (["--methods", "ppo,nonsense"], "unknown method 'nonsense'; registered methods: ppo, dense"),
    (["--env", "NoSuchEnv"], "unknown environment 'NoSuchEnv'"),
    (["--task", "doorkey99"], "--task: unknown 'doorkey99'; choose from"),
    (["--total-steps", "-5"], "--total-steps=-5"),
    (["--num-seeds", "0"], "--num-seeds=0"),
    (["--max-parallel", "0"], "--max-parallel=0"),
    (["--norm-beta-int", "0.1,-1"], "--norm-beta-int='0.1,-1' must be a comma list of numbers >= 0"),
])
def test_k_sensitivity_bad_input_one_line_no_folder(argv, msg, tmp_path, capsys):
    out = str(tmp_path / "ks")
    assert _k_sensitivity().main(argv + ["--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and msg in err and err.startswith("k_sensitivity.py: error:")
    assert not os.path.exists(out)


def test_k_sensitivity_normalised_lines_one_per_beta_int():
    """Each --norm-beta-int value is its own normalised SIOP line at that weight, the other tuned values kept."""
    ks = _k_sensitivity()
    (study,) = ks.studies(ks.build_parser().parse_args(["--methods", "siop", "--norm-beta-int", "0.5,0.05"]))
    arms = {a.name: a for a in study.arms}
    assert list(arms) == ["siop", "siop-norm@beta_int=0.5", "siop-norm@beta_int=0.05"]
    for label, beta in (("siop-norm@beta_int=0.5", 0.5), ("siop-norm@beta_int=0.05", 0.05)):
        assert arms[label].fixed == {**arms["siop"].fixed, "normalize_int": 1.0, "beta_int": beta}


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
    (config,) = ks.studies(args)
    runs = sum(config.num_seeds * max(1, len(a.settings())) for a in config.arms)
    assert runs >= 300 and config.num_seeds >= 20
    # an admitted task, with its tuned lr / ent_coef (dense its own), compute-matched refits, siop crossed with
    # normalisation
    assert config.name == ks.DEFAULT_TASK and config.env == "KeyDoor-5x5" and config.env_kwargs == {"max_steps": 60}
    from _study.admitted import load_admitted
    task = load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))[ks.DEFAULT_TASK]
    arms = {a.name: a for a in config.arms}
    assert dict(arms["dense"].fixed) == task.tuned["dense"] and dict(arms["coevo-ranking"].fixed) == {
        f: v for f, v in task.hparams("coevo-ranking").items() if f != "k"}
    assert arms["siop-norm"].fixed["normalize_int"] == 1.0 and "normalize_int" not in arms["siop"].fixed
    swept = [a for a in config.arms if a.grid]
    assert all(tuple(a.grid["k"]) == (1, 4, 16, 64) and a.static.signal.refit_steps_per_k for a in swept)
    assert arms["ppo"].static.signal is None and config.threshold == 0.8  # (ppo has no refit)
    # every K refits at least twice within the default budget
    assert all(a.static.num_iterations >= 2 * 64 for a in config.arms)


# ----------------------------------------------------------------------------- small pure pieces
def test_chunk_length_and_batch_size():
    assert chunk_length(128, 8) == 16
    assert chunk_length(4, 2) == 2
    assert chunk_length(12, 5) == 2  # divisors of 12 nearest 12/5 = 2.4 in log ratio: 2 (0.18) beats 3 (0.22)
    assert chunk_length(7, 3) == 1  # a prime count: 1 (log ratio 0.85 to 7/3) beats 7 (1.10)
    assert batch_size(5, 3, 1) == 3  # 5 runs in 2 batches of 3 (the last padded)
    assert batch_size(10, 3, 1) == 3  # 4 batches: 3, 3, 3, 1
    assert batch_size(10, 3, 4) == 4  # rounded up to the device count
    assert batch_size(4, None, 1) == 4


def test_a_checkpoint_cut_short_by_a_kill_is_discarded_not_fatal(tmp_path, capsys):
    """A step whose files a kill left incomplete (here: its meta record gone) is deleted with a
    warning and the batch resumes from the step before it; a complete step still restores exactly."""
    from coevo_jax.experiment import checkpoint

    record = checkpoint.BatchRecord("abc", 2, (0, 1))
    state = {"w": jax.numpy.arange(6, dtype=np.float32).reshape(2, 3)}
    sharding = state["w"].sharding
    mngr = checkpoint.manager(str(tmp_path / "ck"))
    meta = record.meta(["loss"], 4)
    checkpoint.save(mngr, 1, state, np.ones((1, 2, 4), np.float32), meta)
    got = checkpoint.restore(mngr, record, state, sharding)
    assert got[3] == 1 and np.array_equal(got[0]["w"], state["w"]) and got[1].shape == (1, 2, 4)
    os.remove(tmp_path / "ck" / "1" / "meta" / "metadata")  # the kill's damage
    mngr = checkpoint.manager(str(tmp_path / "ck"))
    assert checkpoint.restore(mngr, record, state, sharding) is None
    assert "is incomplete" in capsys.readouterr().err and not (tmp_path / "ck" / "1").exists()
    checkpoint.save(mngr, 1, state, np.ones((1, 2, 4), np.float32), meta)  # the rerun saves again
    assert checkpoint.restore(checkpoint.manager(str(tmp_path / "ck")), record, state, sharding)[3] == 1
