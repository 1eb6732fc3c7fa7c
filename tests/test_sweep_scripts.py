"""The learning scripts in ``sweeps/`` as studies: --help defaults, one-line errors,
their default studies, the shared option parsing, and one tiny end-to-end run."""
import importlib.util
import os
import subprocess

import numpy as np
import pytest

from coevo_jax.config import ConfigError, default_hparams

from _study import options
from _study.publish import git_commit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("siop_learning", "coevo_learning", "meta_gradient", "text_learning", "ppo_learning", "calibrate",
           "turn_learning", "compare_methods", "credit_quality", "collusion", "siop_vs_critic", "chain_credit",
           "ircr_horizon", "ircr_ablation")


def load(name):
    spec = importlib.util.spec_from_file_location(f"sweep_{name}", os.path.join(ROOT, "sweeps", f"{name}.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name", SCRIPTS)
def test_help_lists_a_default_for_every_own_option(name):
    from _study import cli

    shared = {a.dest for a in cli.study_parser("x", "", "out")._actions}
    parser = load(name).build_parser()
    own = [a for a in parser._actions if a.dest not in shared]
    assert own
    for action in own:
        assert "default" in (action.help or ""), action.option_strings[0]


@pytest.mark.parametrize("name, argv, msg", [
    ("siop_learning", ["--methods", "ppo,nonsense"], "--methods: unknown 'nonsense'"),
    ("siop_learning", ["--siop-hp", "no_such=1"], "--siop-hp: unknown HParams field 'no_such'"),
    ("coevo_learning", ["--envs", "mujoco"], "--envs: unknown 'mujoco'"),
    ("coevo_learning", ["--total-steps", "keydoor=4096"], "--total-steps: no value for 'cartpole'"),
    ("coevo_learning", ["--grid", "k"], "--grid: 'k' is not field=v1,v2"),
    ("meta_gradient", ["--settings", "ppo,lirpg"], "--settings: unknown 'lirpg'"),
    ("meta_gradient", ["--reward-freq", "0"], "--reward-freq=0"),
    ("text_learning", ["--envs", "KeyDoor-5x5"], "--envs: unknown 'KeyDoor-5x5'"),
    ("text_learning", ["--total-steps", "10"], "--total-steps=10"),
    ("ppo_learning", ["--tasks", "atari"], "--tasks: unknown 'atari'"),
    ("ppo_learning", ["--tasks", "keydoor", "--num-seeds", "0"], "--num-seeds=0 must be >= 1"),
    ("calibrate", ["--tasks", "atari"], "--tasks: unknown 'atari'"),
    ("calibrate", ["--grid", "lr=fast"], "--grid: lr='fast' is not a number"),
    ("compare_methods", ["--tasks", "doorkey8-t100,KeyDoor-5x5"], "--tasks: unknown 'KeyDoor-5x5'; choose from"),
    ("compare_methods", ["--tasks", "doorkey5-h40"], "doorkey5-h40 is withdrawn (at tuned values: ppo 0.81 > 0.8"),
    ("compare_methods", ["--methods", "ppo,lirpg"], "--methods: unknown 'lirpg'"),
    ("compare_methods", ["--admitted", "/nonexistent/admitted.json"], "run sweeps/calibrate.py first"),
    ("credit_quality", ["--task", "doorkey5-h40"], "exact advantages are computed on KeyDoor with its time limit only"),
    ("credit_quality", ["--task", "tetris"], "--task: unknown 'tetris'"),
    ("collusion", ["--task", "doorkey5-h40"], "has a fixed horizon"),
    ("chain_credit", ["--task", "doorkey8-t100"], "the ground truth of the decision is known on DelayedChain and"),
    ("chain_credit", ["--methods", "dense,ircr"], "--methods must include ppo"),
    ("chain_credit", ["--task", "keytodoor-a1", "--noise-std", "0"], "--noise-std=0.0 must be >= 0, on a DelayedChain"),
    ("chain_credit", ["--noise-std", "-1"], "--noise-std=-1.0 must be >= 0, on a DelayedChain task (--task chain-l16"),
    ("chain_credit", ["--hide-cue", "2"], "--hide-cue=2 must be 0 or 1, on a DelayedChain task"),
    ("chain_credit", ["--task", "keytodoor-a1", "--hide-cue", "0"], "--hide-cue=0 must be 0 or 1, on a DelayedChain"),
    ("chain_credit", ["--total-steps", "0"], "--total-steps=0 must be >= 1"),
    ("chain_credit", ["--buffer-episodes", "1"], "--buffer-episodes=1 must be in [2, 65536]"),
    ("ircr_horizon", ["--task", "chain-l16-n05"], "runs on DelayedChain; such tasks: keytodoor-a1"),
    ("ircr_horizon", ["--arms", "ircr,dense"], "--arms must include ppo"),
    ("ircr_horizon", ["--arms", "ppo,ircr@dense"], "--arms: unknown 'ircr@dense'"),
    ("ircr_ablation", ["--tasks", "keytodoor-a1"], "keytodoor-a1 runs on KeyToDoor-Distractor; the credit's"),
    ("siop_vs_critic", ["--settings", "default,nope"], "--settings: unknown 'nope'"),
    ("siop_vs_critic", ["--settings", "td0"], "--settings must include 'default'"),
    ("siop_vs_critic", ["--regime-tasks", "", "--outcome-tasks", ""], "nothing to run"),
    ("siop_vs_critic", ["--outcome-tasks", "Booking-Turns"], "--outcome-tasks: unknown 'Booking-Turns'"),
])
def test_bad_input_is_one_line_and_writes_nothing(name, argv, msg, tmp_path, capsys):
    out = str(tmp_path / "x")
    assert load(name).main(argv + ["--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"{name}.py: error:") and msg in err, err
    assert not os.path.exists(out)


def test_default_studies_keep_each_protocol():
    def built(name, argv=()):
        mod = load(name)
        return mod.studies(mod.build_parser().parse_args(list(argv)))

    siop = built("siop_learning")
    assert [s.env for s in siop] == ["KeyDoor-5x5", "FourRooms"] and all(s.save_final for s in siop)
    assert [a.name for a in siop[0].arms] == ["ppo", "icm", "dense", "siop", "siop-critic"] and siop[0].threshold == 0.9
    assert dict(siop[0].arms[3].fixed) == {"lr": 5e-4, "k": 1, "normalize_int": 0.0, "potential_lr_ratio": 2.0}
    keydoor, cartpole = built("coevo_learning")
    assert dict(cartpole.env_kwargs) == {"reward_freq": 20} and cartpole.threshold_metric == "episode_return"
    assert [a.name for a in keydoor.arms] == ["ppo", "coevo-regression"] and keydoor.num_seeds == 32
    for s in built("meta_gradient"):
        arms = {a.name: a for a in s.arms}
        assert list(arms) == ["ppo", "meta", "meta-rint-only"] and s.env_kwargs == {"reward_freq": 20}
        assert arms["meta"].fixed["r_int_coef"] == pytest.approx(float(default_hparams("meta").signal.r_int_coef))
        assert arms["meta-rint-only"].fixed["r_ext_coef"] == 0.0 and "meta_lr_ratio" not in arms["ppo"].fixed
    (scaled,) = built("meta_gradient", ["--envs", "CartPole-v1", "--settings", "ppo-x0.1,ppo-x10"])
    assert [(a.static.method, a.fixed["beta_ext"], a.fixed["beta_int"]) for a in scaled.arms] == [
        ("constant", 0.1, 0.0), ("constant", 10.0, 0.0)]
    text = built("text_learning", ["--no-legal-mask"])
    assert [s.env for s in text] == ["Booking", "TwentyQuestions"] and all(s.save_final for s in text)
    assert all(s.env_kwargs == {"use_legal_mask": False} for s in text)
    assert [s.name for s in built("ppo_learning")] == ["cartpole", "keydoor"]
    compare = built("compare_methods")
    assert [s.name for s in compare] == ["doorkey8-t100", "keytodoor-a1"] and all(s.num_seeds == 20 for s in compare)
    arms = {a.name: a for a in compare[0].arms}
    methods = load("compare_methods").METHODS
    assert tuple(arms)[:len(methods)] == methods and "meta" in arms
    tuned = load("compare_methods").load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))["doorkey8-t100"]
    assert dict(arms["dense"].fixed) == tuned.tuned["dense"] and dict(arms["siop"].fixed) == tuned.tuned["siop"]
    # the controls of _study/controls.py, each at its tuned values with its held ones on top
    assert [n for n in arms if n in compare_mod_controls()] == ["step-bonus", "frozen-rphi", "rphi-shuffled",
                                                                "ppo-lambda1", "siop-shuffled"]  # no cue bonus off the chain
    assert arms["ppo-lambda1"].static.method == "ppo" and arms["ppo-lambda1"].fixed["gae_lambda"] == 1.0
    (few,) = built("compare_methods", ["--tasks", "doorkey8-t100", "--methods", "ppo,rrd", "--controls", "ppo-lambda1"])
    assert [a.name for a in few.arms][:3] == ["ppo", "rrd", "ppo-lambda1"]
    assert arms["step-bonus"].static.method == "constant" and arms["step-bonus"].fixed["beta_int"] == 1.0
    assert arms["frozen-rphi"].static.method == "coevo-regression" and arms["frozen-rphi"].fixed["reward_lr_ratio"] == 0
    assert arms["rphi-shuffled"].static.method == "coevo-shuffled"
    assert dict(arms["frozen-rphi"].fixed) == {**tuned.tuned["frozen-rphi"], "reward_lr_ratio": 0.0}
    assert arms["siop-shuffled"].static.method == "siop-shuffled" and compare[0].env_kwargs == {"max_steps": 100}
    assert arms["ppo"].static.total_steps == tuned.total_steps and compare[0].threshold == 0.8
    assert not any(n.startswith("siop-replay") for n in arms)
    # sparse PPO at each other (lr, ent_coef) a learned reward was tuned to on the task, and at no other
    (ktd_compare,) = built("compare_methods", ["--tasks", "keytodoor-a1"])
    ktd_task = load("compare_methods").load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))["keytodoor-a1"]
    learned = [m for m in methods if m not in ("ppo", "dense")]
    own = {ktd_task.own_ppo(m) for m in learned} - {"ppo"}
    arms = {a.name: a for a in ktd_compare.arms}
    assert own and sorted(n for n in arms if n.startswith("ppo@")) == sorted(own)
    assert all(arms[n].static.method == "ppo" and tuple((f, arms[n].fixed[f]) for f in ("lr", "ent_coef", "gae_lambda")
                                                         if f in arms[n].fixed)
               in {ktd_task.policy_values(m) for m in learned} for n in own)
    # methods at PPO's own policy values (meta and q-advantage on keytodoor-a1) add no such arm
    same_as_ppo = [m for m in learned if ktd_task.own_ppo(m) == "ppo"]
    assert same_as_ppo
    (same,) = built("compare_methods", ["--tasks", "keytodoor-a1", "--methods", ",".join(["ppo"] + same_as_ppo)])
    assert not any(a.name.startswith("ppo@") for a in same.arms)
    (ablate,) = built("compare_methods", ["--tasks", "fourrooms-t100", "--methods", "siop", "--no-controls", "--ablations"])
    arms = {a.name: a for a in ablate.arms}
    assert list(arms)[:3] == ["siop", "siop-replay-8", "siop-replay-256"] and len(arms) == 7
    assert arms["siop-replay-8"].static.signal.potential_buffer_episodes == 8
    assert arms["siop"].static.signal.ensemble_size == 1 and arms["siop-ensemble-4-min"].static.signal.ensemble_combine \
        == "min" and arms["siop-beta_ext-0"].fixed["beta_ext"] == 0
    assert arms["siop-replay-256"].static.total_steps == arms["siop"].static.total_steps
    (credit,) = built("credit_quality")
    from _study.analysis.credit_quality import arm_signals

    assert credit.save_chunks and credit.num_seeds == 20 and credit.env == "KeyDoor-5x5"
    assert all(arm_signals(a.static.method) for a in credit.arms) and credit.arms[0].name == "ppo"
    tuned16k = load("compare_methods").load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))[credit.name]
    assert dict(credit.arms[-1].fixed) == tuned16k.tuned["dense"] and credit.arms[-1].static.method == "dense"
    assert "random" in arm_signals("ppo") and {"dense", "dense+r"} <= set(arm_signals("dense"))
    (collusion,) = built("collusion")
    arms = {a.name: a for a in collusion.arms}
    assert collusion.env_kwargs == {"max_steps": 60, "give_up": True} and collusion.num_seeds == 20
    assert arms["regression-no-anchor"].fixed["anchor_weight"] == 0 and arms["ranking-no-drift"].fixed["drift_weight"] == 0
    assert arms["ranking-rphi-only"].fixed["beta_ext"] == 0 and arms["ranking"].static.method == "coevo-ranking"
    (chain,) = built("chain_credit")
    arms = {a.name: a for a in chain.arms}
    chain_task = load("compare_methods").load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))[chain.name]
    assert chain.save_chunks and chain.env == "DelayedChain" and chain.num_seeds == 20
    chain_mod = load("chain_credit")
    assert list(arms)[:len(chain_mod.METHODS) + 1] == list(chain_mod.METHODS) + ["coevo-frozen"]
    # sparse PPO at every other (lr, ent_coef) a credit method was tuned to, and at no other
    credit = [m for m in chain_mod.METHODS if m in chain_mod.CREDIT_METHODS]
    pairs = {chain_task.policy_values(m) for m in credit}
    extra = list(arms)[len(chain_mod.METHODS) + 1:]
    assert sorted(extra) == sorted({chain_task.own_ppo(m) for m in credit} - {"ppo"})
    assert len(extra) == len(pairs - {chain_task.policy_values("ppo")})
    assert all(arms[e].static.method == "ppo" and arms[e].fixed["lr"] in {dict(p)["lr"] for p in pairs} for e in extra)
    assert arms["coevo-frozen"].fixed["reward_lr_ratio"] == 0
    assert arms["coevo-frozen"].static.method == "coevo-regression"
    (quiet,) = built("chain_credit", ["--noise-std", "0"])  # the chain without its noise, at the task's values
    assert quiet.env_kwargs == {**chain.env_kwargs, "noise_std": 0.0} and quiet.arms == chain.arms
    (seen,) = built("chain_credit", ["--task", "memchain-l16-n05-gru", "--hide-cue", "0", "--total-steps", "262144"])
    assert seen.env_kwargs["hide_cue"] == 0 and seen.name == "memchain-l16-n05-gru"  # the cue shown, a longer budget
    assert {a.static.total_steps for a in seen.arms} == {262144} and {a.static.network for a in seen.arms} == {"gru"}
    (long,) = built("chain_credit", ["--task", "memchain-l16-n05-gru", "--buffer-episodes", "1024"])  # a longer replay
    replays = {a.name: getattr(a.static.signal, "buffer_episodes", None) for a in long.arms}
    assert replays["q-advantage"] == replays["coevo-frozen"] == 1024
    assert replays["ppo"] is None and replays["siop"] is None  # no replay: unchanged
    (key,) = built("chain_credit", ["--task", "keytodoor-a1"])  # credit at the key pick-up: the same arms
    assert key.save_chunks and key.env == "KeyToDoor-Distractor" and key.name == "keytodoor-a1"
    assert {a.name for a in key.arms} >= set(chain_mod.METHODS) | {"coevo-frozen"}
    ends, fixed = built("ircr_horizon")
    ktd = load("compare_methods").load_admitted(os.path.join(ROOT, "sweeps", "admitted_tasks.json"))["keytodoor-a1"]
    assert (ends.env_kwargs["door_ends_episode"], fixed.env_kwargs["door_ends_episode"]) == (1, 0)
    assert ends.arms == fixed.arms and [a.name for a in ends.arms] == list(load("ircr_horizon").DEFAULT_ARMS)
    arms = {a.name: a for a in ends.arms}
    (tuned_ircr,) = built("ircr_horizon", ["--arms", "ppo,ircr"])[0].arms[1:]
    assert dict(tuned_ircr.fixed) == ktd.tuned["ircr"] and arms["ircr@ppo"].static.signal.buffer_episodes == 256
    at_ppo = {**ktd.tuned["ircr"], "lr": ktd.tuned["ppo"]["lr"], "ent_coef": ktd.tuned["ppo"]["ent_coef"]}
    assert dict(arms["ircr@ppo"].fixed) == at_ppo and dict(arms["ircr+ext@ppo"].fixed) == {**at_ppo, "beta_ext": 1.0}
    (abl,) = built("ircr_ablation", ["--tasks", "chain-l16-n05"])  # R_phi toward IRCR, one property per arm
    arms = {a.name: a for a in abl.arms}
    assert list(arms) == ["ppo", "ircr", "rphi", "rphi-replaced", "rphi-per-step", "rphi-minmax", "rphi-no-penalties",
                          "rphi-as-ircr", "as-ircr-no-penalties", "as-ircr-k1", "as-ircr-ircr-values"]
    base = chain_task.tuned["coevo-regression"]
    assert dict(arms["rphi"].fixed) == base and dict(arms["rphi-per-step"].fixed) == {**base, "per_step_weight": 1.0}
    assert dict(arms["rphi-no-penalties"].fixed) == {**base, "drift_weight": 0.0, "extreme_weight": 0.0}
    as_ircr = {**base, "beta_ext": 0.0, "per_step_weight": 1.0, "minmax_target": 1.0}
    assert dict(arms["rphi-as-ircr"].fixed) == as_ircr
    no_penalties = {**as_ircr, "drift_weight": 0.0, "extreme_weight": 0.0}  # the fit's own weight (anchor_weight) stays
    assert dict(arms["as-ircr-no-penalties"].fixed) == no_penalties
    assert dict(arms["as-ircr-k1"].fixed) == {**no_penalties, "k": 1}
    ircr = chain_task.tuned["ircr"]  # IRCR's tuned values; beta_int and normalize_int its class's (not tuned)
    at_ircr = {**no_penalties, "k": 1, "lr": ircr["lr"], "ent_coef": ircr["ent_coef"], "gae_lambda": ircr["gae_lambda"],
               "reward_lr_ratio": ircr["ircr_lr_ratio"], "beta_int": 1.0, "normalize_int": 0.0}
    assert {k: float(v) for k, v in arms["as-ircr-ircr-values"].fixed.items()} == pytest.approx(at_ircr)
    assert abl.save_chunks and all(a.static.method == "coevo-regression" for a in abl.arms[2:])
    for key, value in chain_task.static_overrides.items():  # every arm with the field runs at the task's override
        having = [a.static.as_dict() for a in chain.arms if key in a.static.as_dict()]
        assert having and all(d[key] == (tuple(value) if isinstance(value, list) else value) for d in having), key


def test_option_parsing():
    assert options.names(" a, b,a ", "--x") == ["a", "b"]
    assert options.hp_values("lr=1e-3, k=2", "--x") == {"lr": 1e-3, "k": 2.0}
    assert options.hp_grid("k=1,4; lr=1e-3", "--x") == {"k": (1.0, 4.0), "lr": (1e-3,)}
    assert options.per_key_ints("7", ["a", "b"], "--x") == {"a": 7, "b": 7}
    assert options.per_key_ints("b=2,a=1", ["a"], "--x") == {"a": 1}
    for call, msg in ((lambda: options.names(",", "--x"), "needs at least one"),
                      (lambda: options.hp_values("lr=abc", "--x"), "not a number"),
                      (lambda: options.per_key_ints("a=0", ["a"], "--x"), "must be >= 1")):
        with pytest.raises(ConfigError, match=msg):
            call()


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory):
    """One persistent compilation cache for the tiny runs below (they compile the same programs)."""
    return str(tmp_path_factory.mktemp("xla_cache"))


def test_ppo_learning_end_to_end_refuse_replot(tmp_path, monkeypatch, capsys, compile_cache):
    """The cheapest script with a tiny network: run, refuse the
    finished folder in one line, replot without running."""
    mod = load("ppo_learning")
    tiny = dict(num_envs=2, rollout_len=8, total_steps=32, update_epochs=1, num_minibatches=1, hidden_sizes=(8,))
    monkeypatch.setitem(mod.TASKS, "cartpole", {**mod.TASKS["cartpole"], "static": tiny})
    out = str(tmp_path / "ppo")
    monkeypatch.setenv("COEVO_JAX_COMPILE_CACHE", compile_cache)
    argv = ["--tasks", "cartpole", "--num-seeds", "2", "--total-steps", "32", "--num-chunks", "1", "--devices", "1",
            "--quiet", "--out", out]
    assert mod.main(argv) == 0
    text = capsys.readouterr().out
    assert "| CartPole-v1 | random | 2 |" in text and "| CartPole-v1 | ppo | 2 |" in text
    assert "Definitions (coevo_jax.analysis.metrics)" in text and "of seeds final return >= 475" in text
    assert os.path.exists(os.path.join(out, "table.md")) and os.path.exists(os.path.join(out, "FINISHED"))
    assert mod.main(argv) == 2 and "holds a finished study" in capsys.readouterr().err
    assert mod.main(argv + ["--replot"]) == 0 and "| CartPole-v1 | ppo | 2 |" in capsys.readouterr().out
    docs = tmp_path / "docs"
    assert mod.main(argv + ["--replot", "--publish", str(docs)]) == 0
    report = (docs / "ppo_learning.md").read_text()
    lines = report.splitlines()
    assert lines[0].startswith("# ") and "do not edit by hand" in lines[2]
    header = dict(ln[4:].split("**: ", 1) for ln in lines if ln.startswith("- **"))
    assert list(header) == ["command", "commit", "machine", "jax", "date", "wall time"]
    assert header["command"] == f"`python sweeps/ppo_learning.py {' '.join(argv)} --replot --publish {docs}`"
    assert header["jax"].startswith("jax 0.") and "cores" in header["machine"]
    assert "| CartPole-v1 | ppo | 2 |" in report and "| CartPole-v1 | random | 2 |" in report
    figures = sorted(os.listdir(docs / "ppo_learning"))
    assert figures and all(f"](ppo_learning/{f})" in report for f in figures)


def test_calibration_admission_rule():
    """Admitted only with random <= 0.2, ppo IQM <= 0.8 and P(dense > ppo) CI low > 0.6 (paired seeds)."""
    import functools

    admit = functools.partial(load("calibrate").admit, n_boot=100)
    ppo = np.linspace(0.3, 0.5, 20)
    assert admit(0.1, ppo, ppo + 0.3)["admitted"]
    assert "random 0.30 > 0.2" in admit(0.3, ppo, ppo + 0.3)["why_not"]
    assert "ppo 0.90 > 0.8" in admit(0.1, ppo + 0.5, ppo + 0.6)["why_not"]
    same = admit(0.1, ppo, ppo[::-1])  # dense no better than ppo: P ~ 0.5
    assert not same["admitted"] and "P(dense > ppo) CI low" in same["why_not"] and abs(same["poi"]["p"] - 0.5) < 0.1


def test_calibration_tunes_on_separate_seeds_and_evaluates_the_best_point():
    mod = load("calibrate")
    args = mod.build_parser().parse_args(["--tasks", "doorkey5-t60", "--grid", "lr=1e-3,2.5e-4;ent_coef=0.01"])
    (tune,) = mod.tune_studies(args, [])
    assert tune.base_seed == args.seed + mod.TUNE_SEED_OFFSET and tune.num_seeds == 3
    assert [a.name for a in tune.arms] == ["ppo", "dense"] and dict(tune.env_kwargs) == {"max_steps": 60}
    assert all(dict(a.grid) == {"lr": (1e-3, 2.5e-4), "ent_coef": (0.01,)} for a in tune.arms)

    class Tuned:  # a finished tuning study: ppo is best at lr 2.5e-4, dense at 1e-3 (ties broken by AUC)
        study = tune
        summary = [{"arm": "ppo", "lr": 1e-3, "ent_coef": 0.01, "final_success_iqm": 0.4, "auc_success_iqm": 0.3},
                   {"arm": "ppo", "lr": 2.5e-4, "ent_coef": 0.01, "final_success_iqm": 0.5, "auc_success_iqm": 0.2},
                   {"arm": "dense", "lr": 1e-3, "ent_coef": 0.01, "final_success_iqm": 0.7, "auc_success_iqm": 0.6},
                   {"arm": "dense", "lr": 2.5e-4, "ent_coef": 0.01, "final_success_iqm": 0.7, "auc_success_iqm": 0.5}]

        def arm(self, label):
            return next((i, a) for i, a in enumerate(tune.arms) if a.name == label)

    (ev,) = mod.eval_studies(args, [[Tuned()]])
    assert ev.base_seed == args.seed and ev.num_seeds == 20 and not any(a.grid for a in ev.arms)
    assert dict(ev.arms[0].fixed) == {"lr": 2.5e-4, "ent_coef": 0.01}
    assert dict(ev.arms[1].fixed) == {"lr": 1e-3, "ent_coef": 0.01}
    # a candidate's StaticConfig fields: PPO's passes go to their own entries, the rest to static_overrides
    (turns,) = mod.tune_studies(mod.build_parser().parse_args(["--tasks", "booking-turns"]), [])
    assert all((a.static.network, a.static.action_head, a.static.hidden_sizes, a.static.rollout_len)
               == ("bag", "utterance", (64, 64), 32) for a in turns.arms)
    assert mod.static_overrides("booking-turns") == {"network": "bag", "action_head": "utterance", "d_model": 64,
                                                     "hidden_sizes": [64, 64]}
    small = mod.candidate_static("ppo", "doorkey5-t60-16k", 1.0)
    assert (small.num_minibatches, small.update_epochs) == (2, 2) and mod.static_overrides("doorkey5-t60-16k") == {}


def test_staged_script_resumes_after_its_first_stage_finished(tmp_path, monkeypatch, capsys, compile_cache):
    """A tune-then-evaluate script interrupted after its first stage: rerunning the command
    loads the finished stage (no 'holds a finished study' refusal) and goes on to the next."""
    from _study import cli

    mod = load("ppo_learning")
    tiny = dict(num_envs=2, rollout_len=8, total_steps=32, update_epochs=1, num_minibatches=1, hidden_sizes=(8,))
    monkeypatch.setitem(mod.TASKS, "cartpole", {**mod.TASKS["cartpole"], "static": tiny})
    argv = ["--tasks", "cartpole", "--num-seeds", "2", "--total-steps", "32", "--num-chunks", "1", "--devices", "1",
            "--quiet", "--out", str(tmp_path / "staged")]
    monkeypatch.setenv("COEVO_JAX_COMPILE_CACHE", compile_cache)
    seen = []

    def second(args, earlier):  # the evaluation stage: killed the first time, nothing left to run the second
        seen.append([r.out for r in earlier[0]])
        if len(seen) == 1:
            raise KeyboardInterrupt
        return []

    stages = [("tune", lambda args, earlier: mod.studies(args)), ("eval", second)]
    report = lambda args, stages: f"stages {len(stages)}"  # noqa: E731
    with pytest.raises(KeyboardInterrupt):
        cli.staged_main(mod.build_parser(), stages, report, argv)
    assert os.path.exists(tmp_path / "staged" / "tune" / "FINISHED")
    capsys.readouterr()
    assert cli.staged_main(mod.build_parser(), stages, report, argv) == 0
    assert seen[0] == seen[1] and "stages 2" in capsys.readouterr().out


def test_siop_vs_critic_arms_and_verdict_rule():
    mod = load("siop_vs_critic")
    made = mod.regime_arms(lambda m, label, hp, st: (label, hp, st), list(mod.SETTINGS))
    labels = [a[0] for a in made]
    # a potential-only setting runs siop alone (its ppo and siop-critic would be the default's)
    assert "siop@potential-heavy" in labels and "ppo@potential-heavy" not in labels
    assert "siop-critic@potential-heavy" not in labels and len(labels) == 3 * 4 + 1
    arms = {a[0]: a for a in made}
    assert arms["ppo@td0+potential-heavy"][1:] == ({"gae_lambda": 0.0}, {})
    assert arms["siop@td0+potential-heavy"][2] == {"potential_steps": 16, "potential_buffer_episodes": 256}
    assert arms["ppo@1-epoch"][2] == {"update_epochs": 1}
    p = lambda p, lo: {"p": p, "ci_low": lo, "ci_high": 1.0}
    assert mod.verdict({"td0": p(0.45, 0.3), "1-epoch": p(0.7, 0.55)}) == "holds"
    assert mod.verdict({"td0": p(0.45, 0.3), "1-epoch": p(0.5, 0.3)}) == "does not hold"
    assert mod.verdict({"td0": p(0.62, 0.45)}) == "mixed"
    assert mod.outcome_verdict({"siop": np.zeros(20), "siop-outcome": np.ones(20)}).startswith(
        "**verdict: the outcome is better**")
    assert "no difference" in mod.outcome_verdict({"siop": np.arange(20.0), "siop-outcome": np.arange(20.0)})


def test_small_png_writes_a_palette_png_at_most_the_limit(tmp_path):
    """A figure over the limit becomes a palette PNG under it (fewer colours, then fewer pixels); not a PNG: untouched."""
    from PIL import Image

    from coevo_jax.analysis.plots import save_figure, subplots
    from _study.figures import small_png

    fig, ax = subplots(figsize=(8, 6))
    ax.imshow(np.random.default_rng(0).random((120, 160)), cmap="viridis")  # noise: a heavy PNG
    path = save_figure(fig, str(tmp_path / "noise.png"), dpi=110)
    before = os.path.getsize(path)
    assert before > 60_000 and small_png(path, max_bytes=60_000) == path
    with Image.open(path) as im:
        assert im.mode == "P" and os.path.getsize(path) <= 60_000
    other = tmp_path / "curve.png"
    other.write_bytes(b"not a png")
    assert small_png(str(other)) == str(other) and other.read_bytes() == b"not a png"


def test_republishing_a_committed_report_is_not_flagged_as_uncommitted(tmp_path):
    import subprocess

    from _study.publish import write_report

    repo = tmp_path / "repo"
    repo.mkdir()
    fig = tmp_path / "curve.png"
    fig.write_bytes(b"first")
    git = lambda *a: subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *a], cwd=repo, check=True,
                                    capture_output=True)
    git("init", "-q")
    path = write_report(str(repo / "docs"), "study", "A study", "python s.py", "| a |", [str(fig)], 1.0, str(repo))
    git("add", "-A")
    git("commit", "-qm", "first")
    fig.write_bytes(b"second")  # the rerun's figure differs from the committed one
    write_report(str(repo / "docs"), "study", "A study", "python s.py", f"| b |\nfigure: {fig}", [str(fig)], 1.0,
                 str(repo))
    text = open(path).read()
    assert "uncommitted" not in text and "| b |" in text
    assert "figure: study/curve.png" in text and str(tmp_path) not in text  # named where it is published
    assert (repo / "docs" / "study" / "curve.png").read_bytes() == b"second"
    (repo / "docs" / "scores.csv").write_text("a")
    git("add", "-A")
    git("commit", "-qm", "scores")
    (repo / "docs" / "scores.csv").write_text("b")  # a file the script publishes beside its report: not flagged
    write_report(str(repo / "docs"), "study", "A study", "python s.py", "| c |", [str(fig)], 1.0, str(repo))
    assert "uncommitted" not in open(path).read()
    (repo / "tracked.txt").write_text("x")
    git("add", "tracked.txt")  # a tracked change to the code is flagged
    write_report(str(repo / "docs"), "study", "A study", "python s.py", "| c |", [str(fig)], 1.0, str(repo))
    assert "+ uncommitted changes (tracked.txt)" in open(path).read()
    write_report(str(repo / "docs"), "study", "A study", "python s.py", f"![c]({fig})", [str(fig)], 1.0, str(repo))
    assert open(path).read().count("study/curve.png") == 1  # a figure the report shows is not listed again


def test_ircr_horizon_final_means_weight_each_iteration_by_its_episodes():
    mod = load("ircr_horizon")
    it = np.arange(20, dtype=np.float64)
    curves = {"episodes": np.stack([np.r_[np.ones(18), 1.0, 3.0], np.r_[np.ones(18), 0.0, 2.0]]),
              "episode_length": np.stack([100 + it, 100 + it]), "episode_return": np.stack([it, it]),
              "success_rate": np.stack([np.r_[np.zeros(18), 1.0, 0.0], np.zeros(20)])}
    curves["episode_length"][:, 18:] = [[10.0, 30.0], [np.nan, 20.0]]  # no episode ended: NaN, weight 0
    m = mod.final_means(curves, np.array([0, 1]), 20)  # the last 10% of 20 iterations: 18 and 19
    assert m["episode_length"] == pytest.approx((10 + 3 * 30 + 2 * 20) / 6)
    assert m["episode_return"] == pytest.approx((18 + 3 * 19 + 2 * 19) / 6)
    assert m["success_rate"] == pytest.approx(1 / 6)
    assert mod.final_means(curves, np.array([0]), 20)["episode_length"] == pytest.approx(25.0)


def compare_mod_controls():
    return load("compare_methods").CONTROLS


def test_compare_methods_best_control_is_the_control_with_the_highest_final_success():
    mod = load("compare_methods")
    rows = [{"arm": "ppo", "final_success_iqm": 0.9}, {"arm": "step-bonus", "final_success_iqm": 0.4},
            {"arm": "frozen-rphi", "final_success_iqm": 0.5}, {"arm": "siop-shuffled", "final_success_iqm": 0.1}]
    assert mod.best_control(rows) == "frozen-rphi"  # ppo is higher, but it is not a control
    assert mod.best_control(rows[:1]) is None


def test_cold_start_children_get_a_fresh_shell_environment(monkeypatch):
    """The cold-start timing runs the README's commands without the caller's PYTHONPATH, XLA flags,
    virtualenv or compile-cache folder: in the fresh venv, with the empty cache it names."""
    import cold_start

    for k, v in (("PYTHONPATH", "/elsewhere"), ("XLA_FLAGS", "--xla_dump_to=x"), ("VIRTUAL_ENV", "/old"),
                 ("COEVO_JAX_COMPILE_CACHE", "/warm"), ("COEVO_JAX_WORKER_CPU", "0")):
        monkeypatch.setenv(k, v)
    env = cold_start.clean_env("/fresh/venv", "/fresh/cache", pip_cache=True)
    assert not {"PYTHONPATH", "XLA_FLAGS", "COEVO_JAX_WORKER_CPU", "PIP_NO_CACHE_DIR"} & set(env)
    assert env["VIRTUAL_ENV"] == "/fresh/venv" and env["PATH"].startswith("/fresh/venv/bin")
    assert env["COEVO_JAX_COMPILE_CACHE"] == "/fresh/cache"
    assert cold_start.clean_env("/v", "/c", pip_cache=False)["PIP_NO_CACHE_DIR"] == "1"


def test_a_header_names_the_commit_and_every_changed_file_whole(tmp_path):
    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    git("init", "-q")
    for name in ("a.py", "sweeps.py"):
        (tmp_path / name).write_text("x = 1\n")
    git("add", ".")
    git("commit", "-qm", "c")
    clean = git_commit(str(tmp_path))
    assert len(clean) == 12 and "+" not in clean
    (tmp_path / "sweeps.py").write_text("x = 2\n")  # the first line of git's list starts with a blank
    (tmp_path / "a.py").write_text("x = 3\n")
    assert git_commit(str(tmp_path)) == f"{clean} + uncommitted changes (a.py, sweeps.py)"
