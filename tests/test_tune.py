"""Equal-budget tuning (sweeps/_study/tuning.py, sweeps/tune.py): the sample, the rule,
the seeds, and the tuned values' way into the admitted-task file and every study's hparams."""
import importlib.util
import json
import os
import shutil

import numpy as np
import pytest

from coevo_jax.config import ConfigError, static_fields
from coevo_jax.reward_net import RewardNetStatic
from _study import tuning

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ADMITTED = os.path.join(ROOT, "sweeps", "admitted_tasks.json")
TASK = "doorkey5-t60-16k"


def load(name):
    spec = importlib.util.spec_from_file_location(f"sweep_{name}", os.path.join(ROOT, "sweeps", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_method_gets_the_same_number_of_configurations_inside_its_ranges():
    from coevo_jax.registry import registered_methods

    samples = {}
    for m in registered_methods():
        space = tuning.search_space(m)
        assert list(space)[:3] == ["lr", "ent_coef", "gae_lambda"] and set(tuning.METHOD_SEARCH.get(m, {})) <= set(space)
        samples[m] = tuning.sample_configs(space, 32, seed=0)
        assert len(samples[m]) == 32 and len({tuple(c.values()) for c in samples[m]}) == 32
        for c in samples[m]:
            assert list(c) == list(space) and all(space[f][0] <= v <= space[f][1] for f, v in c.items())
    # the learned rewards search their own step sizes, and every method sees the same policy points
    assert all(any("lr" in f for f in tuning.METHOD_SEARCH[m]) for m in ("coevo-regression", "siop", "icm", "meta"))
    policy = [[(c["lr"], c["ent_coef"], c["gae_lambda"]) for c in s] for s in samples.values()]
    assert all(p == policy[0] for p in policy)
    # lr reaches 3e-2; 1 - lambda is searched log-uniformly over [1e-4, 0.3] (lambda = 1 is the control ppo-lambda1)
    assert tuning.POLICY_SEARCH["lr"][1] >= 3e-2 and tuning.POLICY_SEARCH["gae_lambda"] == (0.7, 0.9999, "log1m")
    lam = np.array([c["gae_lambda"] for c in samples["ppo"]])
    assert lam.max() < 1.0 and lam.min() >= 0.7
    # each decade of 1 - lambda is hit about equally: as many points within 0.01 of 1 as in [0.7, 0.97]
    decades = np.histogram(np.log10(1 - lam), bins=[-4, -3, -2, -1, np.log10(0.3)])[0]
    assert decades[:3].min() >= 8 and ((lam > 0.99).sum() >= 12), decades
    assert "gae_lambda" not in tuning.search_space("ppo-lambda1") and list(tuning.search_space("ppo-lambda1")) == [
        "lr", "ent_coef"]
    # quasi-random: the 32 lr coordinates leave no gap wider than 2/32 of the unit interval (circularly)
    u = np.sort(tuning.unit_sample(32, 3, seed=0)[:, 0])
    assert np.max(np.diff(np.concatenate([u, [u[0] + 1.0]]))) <= 2 / 32 + 1e-9
    # one arm per method, every configuration vmapped in it: the same run count for each method
    mod = load("tune")
    (study,) = mod.tune_studies(mod.build_parser().parse_args(["--methods", "ppo,siop,coevo-ranking"]), [])
    assert [len(a.settings()) * study.num_seeds for a in study.arms] == [64, 64, 64]
    assert all(a.zipped and a.settings() == samples[a.name] for a in study.arms)
    for bad in (["--num-configs", "16"], ["--finalists", "3"], ["--finalist-seeds", "8"], ["--tune-seeds", "1"],
                ["--tune-base", "0"]):
        assert mod.main([*bad, "--out", "/nonexistent/x"]) == 2, bad
    from _study import cli

    shared = {a.dest for a in cli.study_parser("x", "", "out")._actions}
    assert all("default" in a.help for a in mod.build_parser()._actions if a.dest not in shared)


def test_a_pick_at_the_edge_of_its_range_is_flagged():
    space = {"lr": (1e-4, 1e-2), "gae_lambda": (0.8, 1.0, "linear")}
    assert tuning.edge_fields({"lr": 1e-3, "gae_lambda": 0.9}, space) == []
    # log scale: 1.1e-4 is 2% of the way up in log, 1.2e-3 is not near either end although it is 11% in linear
    assert tuning.edge_fields({"lr": 1.1e-4, "gae_lambda": 0.9}, space) == ["lr (low)"]
    assert tuning.edge_fields({"lr": 1.2e-3, "gae_lambda": 0.995}, space) == ["gae_lambda (high)"]
    assert tuning.edge_fields({"lr": 9.5e-3, "gae_lambda": 0.805}, space) == ["lr (high)", "gae_lambda (low)"]
    # the scale matters: 9e-3 is 98% up the lr range in log (90% in linear), 0.809 4.5% up lambda's in linear
    # (5.01% in log)
    assert tuning.edge_fields({"lr": 9e-3, "gae_lambda": 0.809}, space) == ["lr (high)", "gae_lambda (low)"]
    assert tuning.edge_fields({"lr": 1e-3, "gae_lambda": 0.811}, space) == []
    mod = load("tune")
    pick = {"config": {"lr": 9e-3, "gae_lambda": 0.9},
            "verdict": {"runner_up": 1, "p": 0.7, "ci_low": 0.6, "ci_high": 0.8, "confident": True, "beaten_by": []}}
    assert mod._verdict_text(pick, space).endswith("; EDGE: lr (high)")
    for rng in (*space.values(), (0.7, 0.9999, "log1m")):
        assert tuning.to_unit(tuning.from_unit(0.3, rng), rng) == pytest.approx(0.3)
    lam = (0.7, 0.9999, "log1m")  # 0.99989 is 98.8% up in log(1 - lambda); 0.99 is 57% up (99% in linear)
    assert tuning.edge_fields({"lr": 1e-3, "gae_lambda": 0.99989}, {**space, "gae_lambda": lam}) == ["gae_lambda (high)"]
    assert tuning.edge_fields({"lr": 1e-3, "gae_lambda": 0.99}, {**space, "gae_lambda": lam}) == []


def test_a_search_range_outside_its_field_is_refused():
    for space, msg in (({"nope": (1e-3, 1e-2)}, "the search space names unknown HParams field 'nope'"),
                       ({"lr": (0.0, 1e-2)}, r"search range lr=\(0.0, 0.01\) must be \(low, high\)"),
                       ({"ent_coef": (0.1, 0.01)}, "0 < low < high"),
                       ({"gae_lambda": (0.8, 1.2, "linear")}, r"inside HParams.gae_lambda's range \[0.0, 1.0\]")):
        with pytest.raises(ConfigError, match=msg):
            tuning.check_space("ppo", space)
    tuning.check_space("ppo", {"gae_lambda": (0.8, 1.0, "linear")})  # a linear range may start at or below 0
    with pytest.raises(ConfigError, match="'log1m'\\) with low < high < 1"):
        tuning.check_space("ppo", {"gae_lambda": (0.7, 1.0, "log1m")})


def _synthetic_result(study, success):
    """A finished tuning study whose runs have the success curves ``success [configs, seeds, I]``,
    stored in a shuffled run order."""
    from coevo_jax.experiment.results import StudyResult

    arm = study.arms[0]
    n, s, iters = success.shape
    order = np.random.default_rng(0).permutation(n * s)
    setting, seed = order // s, order % s
    curves = {"success_rate": success[setting, seed].astype(np.float32),
              "env_steps": np.tile(np.arange(1, iters + 1, dtype=np.float32) * 128, (n * s, 1))}
    runs = {"label": np.full(n * s, arm.name), "setting": setting, "seed": seed,
            **{f"hp/{f}": np.asarray([arm.settings()[i][f] for i in setting]) for f in arm.grid}}
    return StudyResult("", study, curves, runs, {})


def test_the_protocol_screens_then_picks_on_fresh_seeds_and_says_when_it_cannot_pick():
    """Stage 1 keeps the best 4 by mean AUC; stage 2 re-runs exactly those on 12 fresh seeds and picks
    by IQM there (not by stage 1's order); the evaluation runs the pick on seeds that meet neither stage."""
    mod = load("tune")
    args = mod.build_parser().parse_args(["--methods", "ppo"])
    (study,) = mod.tune_studies(args, [])
    iters = 10
    success = np.full((32, 2, iters), 0.1)
    success[0, :, 8:] = 1.0  # the best final success, but a late start: AUC 0.28
    success[3] = 0.5  # steady: AUC 0.5 on both seeds (the best)
    success[5, 0], success[5, 1] = 0.9, np.nan  # one lucky seed, no episode on the other: mean AUC 0.45
    success[9] = 0.5  # a tie with config 3, sampled later
    stage1 = _synthetic_result(study, success)
    scores = tuning.arm_scores(stage1, "ppo")
    assert scores.shape == (32, 2) and np.allclose(scores[3], 0.5) and np.allclose(scores[5], [0.9, 0.0])
    assert np.allclose(scores[0], 0.1 * 0.8 + 0.2)
    assert tuning.select_config(scores) == 3 and tuning.finalists(scores, 4) == [3, 9, 5, 0]
    (fin,) = mod.finalist_studies(args, [[stage1]])
    settings = study.arms[0].settings()
    assert fin.arms[0].settings() == [settings[i] for i in (3, 9, 5, 0)] and fin.num_seeds == 12
    # stage 2: stage 1's third (config 5) is the best on fresh seeds, the runner-up (config 3) close behind
    rng = np.random.default_rng(1)
    s2 = np.full((4, 12, iters), 0.0)
    spread = np.linspace(0.3, 0.6, 12)[:, None]
    s2[0] = spread
    s2[1] = 0.10
    s2[2] = rng.permutation(spread) + 0.01
    s2[3] = 0.20
    stage2 = _synthetic_result(fin, s2)
    pick = mod.chosen(stage1, stage2, 4)["ppo"]
    assert pick["index"] == 2 and pick["config"] == settings[5]
    v = pick["verdict"]
    assert v["runner_up"] == 0 and v["ci_low"] <= 0.5 and not v["confident"] and v["beaten_by"] == []
    # P(pick > runner-up) is stage 2's (12 seeds), not stage 1's (where config 5 against config 3 is 0.5)
    from coevo_jax.analysis import stats

    assert pick["stage2"].shape == (4, 12) and v["p"] > 0.5
    assert v["p"] == pytest.approx(stats.probability_of_improvement(pick["stage2"][2], pick["stage2"][0])["p"])
    assert "cannot pick with confidence" in mod._verdict_text(pick, tuning.search_space("ppo"))
    # a clear winner is confident, and a pick that another finalist beats with confidence says so
    s = np.array([[0.5] * 12, [0.1] * 12, [0.2] * 12, [0.3] * 12]) + 0.01 * rng.random((4, 12))
    assert tuning.select_finalist(s) == 0 and tuning.pick_verdict(s, 0)["confident"]
    assert tuning.pick_verdict(s, 1)["beaten_by"] == [0, 2, 3]
    rows = tuning.finalist_rows(pick["finalists"], pick["stage1"], s, s, 0)
    assert [r["pick"] for r in rows] == ["PICK", "", "", ""] and rows[1]["P(pick > it) [95% CI]"].startswith("1.00")
    # evaluation: the pick, exactly, on fresh seeds; dense joins at its recorded values
    (ev,) = mod.eval_studies(args, [[stage1], [stage2]])
    arms = {a.name: a for a in ev.arms}
    assert dict(arms["ppo"].fixed) == settings[5] and not arms["ppo"].grid and list(arms) == ["ppo", "dense"]
    from _study.admitted import load_admitted

    assert dict(arms["dense"].fixed) == load_admitted(ADMITTED)[TASK].tuned["dense"]
    # the oracle tuned alone: PPO joins at its recorded values, so the admission rule is judged again
    dense_args = mod.build_parser().parse_args(["--methods", "dense"])
    (d1,) = mod.tune_studies(dense_args, [])
    d_stage1 = _synthetic_result(d1, success)
    (d2,) = mod.finalist_studies(dense_args, [[d_stage1]])
    (d_ev,) = mod.eval_studies(dense_args, [[d_stage1], [_synthetic_result(d2, s2)]])
    assert [a.name for a in d_ev.arms] == ["dense", "ppo"]
    assert dict(d_ev.arms[1].fixed) == load_admitted(ADMITTED)[TASK].tuned["ppo"]
    # the seeds of the two stages and of the evaluation never meet, nor do a reproduction's
    from coevo_jax.experiment.plan import run_keys

    def keys(s):
        return {tuple(k) for k in np.asarray(run_keys(s.base_seed, np.arange(s.num_seeds)))}

    assert (study.base_seed, fin.base_seed, ev.base_seed) == tuning.stage_bases(0) == (1000, 2000, 0)
    assert len(keys(study) | keys(fin) | keys(ev)) == 2 + 12 + 20
    repro = mod.build_parser().parse_args(["--methods", "ppo", "--tune-base", "5000"])
    (r1,) = mod.tune_studies(repro, [])
    (r2,) = mod.finalist_studies(repro, [[stage1]])
    assert len(keys(study) | keys(fin) | keys(ev) | keys(r1) | keys(r2)) == 2 * (2 + 12) + 20
    with pytest.raises(ConfigError, match="meet the evaluation's"):
        tuning.stage_bases(1000, tune_base=0)
    with pytest.raises(ConfigError, match="meet the default run's"):  # a reproduction on the pick's own seeds
        tuning.stage_bases(0, tune_base=2000)
    # a stage 1 whose sample is not today's (a range changed since it ran) is refused, not re-read
    with pytest.raises(ConfigError, match="not today's sample"):
        mod.screened(stage1, 4, sample_seed=1)


def task_values(method, path):
    from _study.admitted import load_admitted

    return load_admitted(path)[TASK].hparams(method)


def test_tuned_values_reach_every_study_and_are_never_replaced_silently(tmp_path):
    from _study.admitted import load_admitted, write_tuned
    from coevo_jax.experiment.plan import arm_hparams

    path = str(tmp_path / "admitted.json")
    shutil.copy(ADMITTED, path)
    data = json.load(open(path))  # the task as calibration left it: only ppo and dense have values
    entry = next(t for t in data["tasks"] if t["task"] == TASK)
    entry["tuned"] = {m: entry["tuned"][m] for m in ("ppo", "dense")}  # (no records folder copied: no records)
    entry.pop("withdrawn", None)  # the comparisons run only admitted tasks
    json.dump(data, open(path, "w"))
    # values of the declared fields (whatever their names), as the tuner would pick them
    siop = tuning.sample_configs(tuning.search_space("siop"), 16)[5]
    reg = tuning.sample_configs(tuning.search_space("coevo-regression"), 16)[7]
    assert "beta_int" in siop and siop != task_values("ppo", path)
    record = {"rule": tuning.RULE, "num_configs": 16}
    assert write_tuned(path, TASK, {"siop": siop, "coevo-regression": reg}, {"siop": record}) == [
        "siop", "coevo-regression"]
    task = load_admitted(path)[TASK]
    assert task.hparams("siop") == siop and task.untuned(["siop", "coevo-regression", "ppo"]) == [
        "coevo-regression", "ppo"]

    compare = load("compare_methods")
    (study,) = compare.studies(compare.build_parser().parse_args(["--tasks", TASK, "--admitted", path]))
    arms = {a.name: a for a in study.arms}
    assert dict(arms["siop"].fixed) == siop and dict(arms["siop-shuffled"].fixed) == siop
    assert dict(arms["coevo-regression"].fixed) == reg
    assert dict(arms["ppo"].fixed) == task.tuned["ppo"] and dict(arms["icm"].fixed) == task.tuned["ppo"]
    hp = arm_hparams(arms["siop"])
    assert all(np.isclose(float(hp.as_dict()[f][0]), v, rtol=1e-6) for f, v in siop.items())

    ks = load("k_sensitivity")
    (kstudy,) = ks.studies(ks.build_parser().parse_args(["--admitted", path, "--num-seeds", "1"]))
    karms = {a.name: a for a in kstudy.arms}
    assert dict(karms["siop"].fixed) == siop and karms["siop-norm"].fixed == {**siop, "normalize_int": 1.0}
    assert dict(karms["coevo-regression"].fixed) == reg and tuple(karms["siop"].grid["k"]) == ks.DEFAULT_KS
    khp = arm_hparams(karms["coevo-regression"])
    assert all(np.allclose(np.asarray(khp.as_dict()[f]), v, rtol=1e-6) for f, v in reg.items())

    # equal values (to float32) pass; different ones are refused, then replaced with the old kept
    assert write_tuned(path, TASK, {"siop": {**siop, "lr": float(np.float32(siop["lr"]))}}, {}) == []
    with pytest.raises(ConfigError, match="siop already has tuned values .* pass --replace-tuned"):
        write_tuned(path, TASK, {"ppo": task.tuned["ppo"], "siop": {**siop, "beta_int": 0.5}}, {})
    assert load_admitted(path)[TASK].hparams("siop") == siop  # nothing written
    write_tuned(path, TASK, {"siop": {**siop, "beta_int": 0.5}}, {"siop": record}, replace=True)
    entry = next(t for t in json.load(open(path))["tasks"] if t["task"] == TASK)
    history = json.load(open(tmp_path / "tuning_records" / f"{TASK}.json"))["tuned_history"]
    assert entry["tuned"]["siop"]["beta_int"] == 0.5 and history[-1]["tuned"] == siop and "tuning" not in entry

    # calibrating the task again keeps the other methods' values and refuses a different ppo
    calibrate = load("calibrate")
    old = dict(entry, tuned={"ppo": entry["tuned"]["ppo"], "dense": entry["tuned"]["dense"]})
    calibrate.write_admitted(path, [json.loads(json.dumps(old))], [TASK], 20)
    again = load_admitted(path)[TASK]
    assert again.tuned["siop"]["beta_int"] == 0.5 and "siop" in again.tuning
    changed = dict(old, tuned={**old["tuned"], "ppo": {"lr": 1e-3, "ent_coef": 0.03}})
    with pytest.raises(ConfigError, match="ppo already has tuned values"):
        calibrate.write_admitted(path, [json.loads(json.dumps(changed))], [TASK], 20)


def test_a_tuning_write_changes_only_its_tasks_records_file_and_the_admitted_file(tmp_path):
    """The picks live in the small admitted-task file, each task's records (``tuning``,
    ``tuned_history``) in ``tuning_records/<task>.json`` beside it: a write rewrites those two
    files and leaves every other task's records untouched, byte for byte; a refused one writes nothing."""
    from _study.admitted import load_admitted, records_path, write_tuned

    path = str(tmp_path / "admitted_tasks.json")
    shutil.copy(ADMITTED, path)
    shutil.copytree(os.path.join(ROOT, "sweeps", "tuning_records"), tmp_path / "tuning_records")
    assert load_admitted(path) == load_admitted(ADMITTED)

    def files():
        return {str(p.relative_to(tmp_path)): (p.read_bytes(), p.stat().st_mtime_ns)
                for p in sorted(tmp_path.rglob("*")) if p.is_file()}

    before, mine = files(), os.path.relpath(records_path(path, TASK), tmp_path)
    assert mine in before and len(before) > 2
    task = load_admitted(path)[TASK]
    siop = {**task.tuned["siop"], "beta_int": 0.5}
    with pytest.raises(ConfigError, match="pass --replace-tuned"):
        write_tuned(path, TASK, {"siop": siop}, {"siop": {"rule": tuning.RULE}})
    assert files() == before  # refused: nothing written
    write_tuned(path, TASK, {"siop": siop}, {"siop": {"rule": tuning.RULE}}, replace=True)
    after = files()
    assert sorted(after) == sorted(before)
    assert {f for f in before if after[f] != before[f]} == {"admitted_tasks.json", mine}
    data = json.loads(after["admitted_tasks.json"][0])
    assert not any(k in t for t in data["tasks"] for k in ("tuning", "tuned_history"))
    records = json.loads(after[mine][0])
    assert records["tuning"]["siop"] == {"rule": tuning.RULE} and records["tuned_history"][-1]["tuned"] == task.tuned[
        "siop"]
    again = load_admitted(path)
    assert again[TASK].tuned["siop"] == siop and {t: a for t, a in again.items() if t != TASK} == {
        t: a for t, a in load_admitted(ADMITTED).items() if t != TASK}


def test_a_tasks_static_overrides_reach_every_method_that_has_them_and_unknown_fields_are_refused(tmp_path):
    from _study.admitted import load_admitted

    path = str(tmp_path / "admitted.json")
    data = json.load(open(ADMITTED))
    entry = next(t for t in data["tasks"] if t["task"] == TASK)
    entry.pop("withdrawn", None)  # the comparisons run only admitted tasks
    entry["static_overrides"] = {"buffer_episodes": 256, "potential_buffer_episodes": 128}
    json.dump(data, open(path, "w"))
    compare = load("compare_methods")
    (study,) = compare.studies(compare.build_parser().parse_args(["--tasks", TASK, "--admitted", path]))
    for arm in study.arms:  # each method takes the fields it has (R_phi's replay, the potential's) and no other
        fields = arm.static.as_dict()
        want = {f: v for f, v in entry["static_overrides"].items() if f in static_fields(arm.static.method)}
        assert {f: fields[f] for f in want} == want and fields.keys() >= want.keys(), arm.name
    assert {a.static.signal.buffer_episodes for a in study.arms if isinstance(a.static.signal, RewardNetStatic)} == {256}
    assert {a.static.signal.potential_buffer_episodes for a in study.arms if a.static.method == "siop"} == {128}
    # a study's own static change still wins over the task's; it must be the method's own
    assert load_admitted(path)[TASK].static("siop", potential_buffer_episodes=8).signal.potential_buffer_episodes == 8
    with pytest.raises(ConfigError, match="StaticConfig.buffer_episodes is a static option of method"):
        load_admitted(path)[TASK].static("siop", buffer_episodes=8)
    entry["static_overrides"] = {"buffer_episode": 256}
    json.dump(data, open(path, "w"))
    with pytest.raises(ConfigError, match="static_overrides has buffer_episode, not StaticConfig fields"):
        load_admitted(path)


def test_a_zipped_grid_runs_its_points_not_their_product():
    from coevo_jax.config import StaticConfig
    from coevo_jax.experiment import Arm, Study
    from coevo_jax.experiment.plan import arm_hparams
    from coevo_jax.experiment.spec import config_text

    configs = [{"lr": 1e-3, "ent_coef": 0.01}, {"lr": 2e-3, "ent_coef": 0.02}, {"lr": 3e-3, "ent_coef": 0.01}]
    arm = tuning.tuning_arm(StaticConfig(method="ppo"), configs)
    hp = arm_hparams(arm)
    assert np.allclose(np.asarray(hp.ppo.lr), [1e-3, 2e-3, 3e-3])
    assert np.allclose(np.asarray(hp.ppo.ent_coef), [.01, .02, .01])
    crossed = Arm(arm.static, arm.grid)
    assert len(crossed.settings()) == 9 and "zipped" not in json.dumps(crossed.to_json())
    study = Study("KeyDoor-5x5", (arm, crossed), 2)
    back = Study.from_json(json.loads(config_text(study)))
    assert [a.zipped for a in back.arms] == [True, False] and config_text(back) == config_text(study)
    with pytest.raises(ConfigError, match="a zipped grid needs as many values for every field, got lr: 2, k: 1"):
        Arm(arm.static, {"lr": (1e-3, 2e-3), "k": (1,)}, zipped=True).settings()


def test_what_r_phi_learned_is_reported_per_configuration_in_order_of_its_lr_ratio():
    """The report's R_phi table: one row per configuration, sorted by reward_lr_ratio, with
    R_phi's own lr (policy lr x ratio) and each metric's mean over the second half of training
    and over the seeds; Spearman's rho against the ratio (-1 for a metric falling with it)."""
    mod = load("tune")
    args = mod.build_parser().parse_args(["--methods", "coevo-regression", "--tune-seeds", "2"])
    (study,) = mod.tune_studies(args, [])
    arm = study.arms[0]
    iters = arm.static.num_iterations
    ratios = np.array([c["reward_lr_ratio"] for c in arm.settings()])
    success = np.full((32, 2, iters), 0.2)
    result = _synthetic_result(study, success)
    setting = result.runs["setting"]
    corr = np.zeros((len(setting), iters), np.float32)
    corr[:, iters // 2:] = -np.log(ratios[setting])[:, None]  # falls with the ratio, late in training only
    corr[:, : iters // 2] = 5.0  # the first half is not read
    result.curves.update({"signal/val_corr": corr, "signal/r_phi_abs_mean": np.full_like(corr, 0.01)})
    rows, rho = tuning.learned_reward_rows(result, "coevo-regression")
    assert [r["reward_lr_ratio"] for r in rows] == sorted(ratios.tolist()) and len(rows) == 32
    first = rows[0]
    config = arm.settings()[first["config"]]
    assert first["R_phi lr"] == pytest.approx(config["lr"] * config["reward_lr_ratio"], rel=1e-2)
    assert first["held-out corr"] == pytest.approx(-np.log(config["reward_lr_ratio"]), rel=1e-5)
    assert first["|R_phi| per step"] == pytest.approx(0.01) and first["tuning AUC"] == pytest.approx(0.2)
    assert rho["held-out corr"] == pytest.approx(-1.0) and np.isnan(rho["tuning AUC"])  # AUC constant
    assert tuning.learned_reward_rows(_synthetic_result(study, success), "coevo-regression") == ([], {})


def test_a_task_that_fails_the_rule_at_tuned_values_is_withdrawn_from_the_comparisons(tmp_path):
    """tune.py records why a task fails the admission rule once PPO is tuned (``withdrawn``);
    ``--tasks all`` leaves it out, naming it is refused in one line that says why, and a later
    verdict that holds again clears it. The rule itself: tuned PPO that solves the task fails it."""
    from _study.admitted import admit, load_admitted, write_tuned

    rng = np.random.default_rng(0)
    solved = admit(0.05, np.clip(0.99 + 0.01 * rng.standard_normal(20), 0, 1), np.ones(20), n_boot=200)
    assert not solved["admitted"] and "ppo 0.99 > 0.8" in solved["why_not"]
    path = str(tmp_path / "admitted.json")
    shutil.copy(ADMITTED, path)
    ppo = load_admitted(path)[TASK].tuned["ppo"]
    why = f"at tuned values: {solved['why_not']} (sweeps/tune.py)"
    write_tuned(path, TASK, {"ppo": ppo}, {}, withdrawn=why)
    assert load_admitted(path)[TASK].withdrawn == why
    compare = load("compare_methods")
    every = compare.studies(compare.build_parser().parse_args(["--tasks", "all", "--admitted", path]))
    assert TASK not in [s.name for s in every] and every
    with pytest.raises(ConfigError, match=f"--tasks: {TASK} is withdrawn \\(at tuned values: ppo 0.99 > 0.8"):
        compare.studies(compare.build_parser().parse_args(["--tasks", TASK, "--admitted", path]))
    write_tuned(path, TASK, {"ppo": ppo}, {}, withdrawn=None)  # not judged (ppo not tuned in that run): kept
    assert load_admitted(path)[TASK].withdrawn == why
    write_tuned(path, TASK, {"ppo": ppo}, {}, withdrawn="")  # the rule holds again
    assert load_admitted(path)[TASK].withdrawn == ""


def test_controls_are_tuned_like_methods_and_recorded_under_their_own_names(tmp_path):
    """A control is tuned with the same protocol (the policy's space plus its own, its held values fixed),
    its pick is recorded under its label, and the comparison runs it there."""
    from _study.admitted import load_admitted, write_tuned
    from _study.controls import CONTROLS

    mod = load("tune")
    labels = ["step-bonus", "frozen-rphi", "rphi-shuffled", "cue-bonus-after-choice"]
    args = mod.build_parser().parse_args(["--task", "chain-l16-n05", "--methods", ",".join(labels)])
    (study,) = mod.tune_studies(args, [])
    arms = {a.name: a for a in study.arms}
    assert list(arms) == labels and all(len(a.settings()) == 32 for a in arms.values())
    assert tuning.search_space("step-bonus")["constant_reward"] == (-0.05, 0.05, "linear")
    c = np.array([s["constant_reward"] for s in arms["step-bonus"].settings()])
    assert (c > 0).sum() >= 12 and (c < 0).sum() >= 12  # both signs searched
    assert arms["frozen-rphi"].fixed == {"reward_lr_ratio": 0.0} and "reward_lr_ratio" not in arms["frozen-rphi"].grid
    assert set(tuning.search_space("rphi-shuffled")) == set(tuning.search_space("coevo-regression"))
    assert arms["cue-bonus-after-choice"].static.method == "cue-bonus"
    assert arms["cue-bonus-after-choice"].fixed == {"cue_after_choice": 1.0}
    # the cue bonus exists only where there is a cue
    assert mod.main(["--methods", "cue-bonus-every-step", "--out", str(tmp_path / "x")]) == 2
    # recorded under its label; the comparison runs it at those values with its held ones on top
    path = str(tmp_path / "admitted.json")
    shutil.copy(ADMITTED, path)
    pick = arms["step-bonus"].settings()[3]
    write_tuned(path, "chain-l16-n05", {"step-bonus": pick}, {"step-bonus": {"rule": tuning.RULE}}, replace=True)
    compare = load("compare_methods")
    (cstudy,) = compare.studies(compare.build_parser().parse_args(["--tasks", "chain-l16-n05", "--admitted", path]))
    carms = {a.name: a for a in cstudy.arms}
    assert dict(carms["step-bonus"].fixed) == {**pick, **CONTROLS["step-bonus"].fixed}
    assert {"cue-bonus-every-step", "cue-bonus-after-choice", "frozen-rphi", "rphi-shuffled"} <= set(carms)
    assert "step-bonus" not in load_admitted(path)["chain-l16-n05"].untuned(["step-bonus"])


def test_the_verdict_rule_needs_every_comparison_and_corrects_for_the_methods():
    from _study.verdict import verdict_rows

    from coevo_jax.analysis import stats

    rng = np.random.default_rng(0)
    base = rng.random(20)
    finals = {"ppo": base, "step-bonus": base + 0.3,
              "clear": base + 0.8,  # beats ppo and the control: p 0
              "ppo-only": base + 0.38,  # beats ppo alone (p 0.001), not the control (p 0.20)
              "marginal": base + 0.52}  # beats both, the control with p 0.022: alone yes, second of three no
    p = {m: max(stats.improvement_pvalue(finals[m], finals[a]) for a in ("ppo", "step-bonus")) for m in finals}
    assert stats.improvement_pvalue(finals["ppo-only"], base) < 0.0125 and p["ppo-only"] > 0.1
    assert 0.025 / 2 < p["marginal"] < 0.025 and p["clear"] < 0.025 / 3
    rows = {r["method"]: r for r in verdict_rows(finals, ["clear", "ppo-only", "marginal"], ["ppo", "step-bonus"])}
    assert {m: r["verdict"] for m, r in rows.items()} == {"clear": "wins (1)", "ppo-only": "no", "marginal": "no"}
    assert [rows[m]["Holm threshold"] for m in ("clear", "marginal", "ppo-only")] == ["0.0083", "0.0125", "0.0250"]
    alone = verdict_rows(finals, ["marginal"], ["ppo", "step-bonus"])[0]
    assert alone["verdict"] == "wins (1)"  # with one method the rule is its 95% CIs' lower ends
    assert all(float(c.split("[")[1].split(",")[0]) > 0.5 for k, c in alone.items() if k.startswith("P(>"))
    assert set(rows["clear"]) >= {"P(> ppo)", "P(> step-bonus)", "p (largest)", "Holm threshold"}
    undecided = verdict_rows(finals, ["clear"], ["ppo"], undecidable="no tuned control ran")
    assert undecided[0]["verdict"] == "undecidable: no tuned control ran"
    # Holm: three p-values just under 0.05 each pass alone, not as a family of three
    assert stats.holm({"a": 0.04, "b": 0.045, "c": 0.049}) == {"a": False, "b": False, "c": False}
    assert stats.holm({"a": 0.01, "b": 0.02, "c": 0.049}) == {"a": True, "b": True, "c": True}
    assert stats.holm({"a": 0.03, "b": 0.06, "c": 0.001}) == {"c": True, "a": False, "b": False}  # 0.03 > 0.05 / 2
    # the p-value agrees with rliable's percentile CI: below alpha exactly when the 1 - 2 alpha CI's low end > 0.5
    x, y = rng.random(20) + 0.2, rng.random(20)
    pv = stats.improvement_pvalue(x, y)
    for alpha in (0.025, 0.05, 0.1):
        low = stats.probability_of_improvement(x, y, alpha=2 * alpha)["ci_low"]
        assert (pv < alpha) == (low > 0.5) or abs(low - 0.5) < 0.01
    # which records count as the two-stage protocol (a verdict against anything else is undecidable)
    from _study.admitted import load_admitted

    admitted = load_admitted(ADMITTED)
    assert admitted["doorkey5-t60"].not_two_stage(["ppo", "dense"]) == ["ppo", "dense"]  # 16 x 3, no lambda
    assert admitted["fourrooms-t100"].not_two_stage(["ppo", "step-bonus", "rphi-shuffled", "nope"]) == ["nope"]
    # and an evaluation on a tuning stage's seeds is refused before anything runs
    compare = load("compare_methods")
    assert 1000 in admitted["fourrooms-t100"].stage_bases()
    assert compare.main(["--tasks", "fourrooms-t100", "--seed", "1000", "--out", "/nonexistent/x"]) == 2


def test_the_k_study_runs_the_tunings_settings_and_its_row_at_the_tuned_k_is_the_tuning():
    """The main job sweeps K at each method's own task settings; compute matching is anchored at the
    tuned K, so the gradient steps of a refit there are the tuning's (and 4x that at 4x the K)."""
    import coevo_jax as cj
    from coevo_jax.fit import refit_steps
    from _study.admitted import load_admitted

    ks = load("k_sensitivity")
    (study,) = ks.studies(ks.build_parser().parse_args([]))
    task = load_admitted(ADMITTED)[TASK]
    for arm in study.arms:
        m = arm.static.method
        tuned = task.static(m)
        if not arm.grid:  # the reference lines: exactly the tuning's settings
            assert arm.static == tuned, m
            continue
        steps = "reward_steps" if m.startswith("coevo") else "potential_steps"  # the swept: R_phi's, siop's
        assert arm.static.replace(refit_steps_per_k=False, **{steps: getattr(tuned.signal, steps)}) == tuned, m
        k_ref = int(cj.default_hparams(m).signal.k)
        for k, factor in ((k_ref, 1), (4 * k_ref, 4)):
            hp = cj.default_hparams(m, k=k)
            refit = refit_steps(getattr(arm.static.signal, steps), arm.static, hp)
            assert int(refit) == factor * getattr(tuned.signal, steps), m
        assert dict(arm.fixed).items() >= {f: v for f, v in task.hparams(m).items() if f != "k"}.items()
    # a task that fails the admission rule at its tuned values is said to be unable to rank the methods
    args = ks.build_parser().parse_args([])
    assert "**doorkey5-t60 is withdrawn** (at tuned values" in ks.withdrawn_note(args, "doorkey5-t60")
    assert ks.withdrawn_note(args, "chain-l16-n05") == ""


def test_the_comparison_shows_the_size_each_learned_reward_pays_per_step():
    """The frozen R_phi control is matched to the trained R_phi by size: the table reports |beta_int| x
    R_phi's mean absolute value per step over the second half of training, for every arm with an R_phi."""
    import types

    import coevo_jax as cj
    from coevo_jax.experiment.spec import Arm

    compare = load("compare_methods")
    frozen = Arm(cj.static_config("coevo-regression", total_steps=1024, num_envs=4, rollout_len=32),
                 fixed={"beta_int": -40.0}, label="frozen-rphi")
    ppo = Arm(cj.static_config("ppo", total_steps=1024, num_envs=4, rollout_len=32), label="ppo")
    n = frozen.static.num_iterations
    size = np.full((4, n), np.nan)
    size[:2] = np.linspace(0.0, 2e-3, n)  # frozen's two runs: 1e-3 early, 1.5e-3 on average over the late half
    arms = {"frozen-rphi": (0, frozen), "ppo": (1, ppo)}
    result = types.SimpleNamespace(curves={"signal/r_phi_abs_mean": size}, arm=lambda label: arms[label],
                                   select=lambda label: np.arange(2) + 2 * arms[label][0])
    late = np.linspace(0.0, 2e-3, n)[n // 2:].mean()
    assert compare.paid_size(result, "frozen-rphi") == f"{40 * late:.2g}"
    assert compare.paid_size(result, "ppo") == "-"
    assert compare.paid_size(types.SimpleNamespace(curves={}), "ppo") == "-"
