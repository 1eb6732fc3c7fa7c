"""The suite (sweeps/suite.py, sweeps/_study/suite.py): its score is the mean normalised score over tasks,
its plan is fixed before the evaluation and checked after it, and a user's method from a file of its own
gets its row against the stored arms without re-running them (refused when they came from other settings)."""
import csv
import importlib.util
import json
import os
import sys

import numpy as np
import pytest

from coevo_jax.analysis.report import load_report
from coevo_jax.config import ConfigError
from coevo_jax.registry import unregister_method

from _study import suite

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TINY = {"env": "DelayedChain", "env_kwargs": {"length": 4, "noise_std": 0.0}, "total_steps": 1024, "num_envs": 4,
        "rollout_len": 16, "metric": "success_rate", "random": 0.125, "optimum": 1.0, "source": "test",
        "num_minibatches": 2, "update_epochs": 1, "static_overrides": {"hidden_sizes": [16]}}

USER_METHOD = '''
"""A user's method, in a file of its own: PPO plus a bonus for the action that equals DelayedChain's cue
(its first K inputs) wherever the cue is shown; no library file names it."""
from coevo_jax.params import hyperparams, param
from coevo_jax.registry import MethodSpec, register_method
from coevo_jax.signals import RewardStreams, Signal, SignalParams
from coevo_jax.signals.base import no_observe, no_update
import jax.numpy as jnp


@hyperparams
class PlusParams(SignalParams):
    plus: float = param(0.5, 0.0, 1.0, doc="paid for the action that equals the cue shown")


def cue_bonus(traj, hp, num_actions):
    return hp.signal.plus * traj.obs[..., :num_actions]  # [T, N, A]


def make(static, network, env, env_params):
    n = env.action_space(env_params).n

    def rewards(state, traj, hp):
        paid = jnp.take_along_axis(cue_bonus(traj, hp, n), traj.action[..., None].astype(jnp.int32), -1)[..., 0]
        return state, RewardStreams(traj.reward + paid), {}

    def credit(state, traj, hp, probs):
        return cue_bonus(traj, hp, probs.shape[-1])

    return Signal(lambda key, traj, hp: {}, no_observe, no_update, rewards, credit)


register_method(MethodSpec("user-plus", make, params=PlusParams, doc="PPO plus a cue bonus"))
'''


def load():
    spec = importlib.util.spec_from_file_location("sweep_suite", os.path.join(ROOT, "sweeps", "suite.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def task(**kw):
    return suite.SuiteTask(**{**TINY, "name": "t", **kw})


def test_the_suite_score_is_the_mean_normalised_score_over_tasks():
    a, b = task(name="a", random=0.5, optimum=2.5), task(name="b", random=0.0, optimum=100.0)
    np.testing.assert_allclose(a.normalise([0.5, 2.5, 1.5, np.nan]), [0.0, 1.0, 0.5, 0.0])
    raw = {"a": np.array([[0.5, 0.5], [2.5, 1.5]]), "b": np.array([[60.0, 40.0], [10.0, 10.0]])}  # [configs, seeds]
    per = {"a": a.normalise(raw["a"]), "b": b.normalise(raw["b"])}
    # config 0: a 0, b 0.5 -> 0.25; config 1: a 0.75, b 0.1 -> 0.425
    np.testing.assert_allclose(suite.suite_score(per), [0.25, 0.425])
    assert suite.finalists(per, 2) == [1, 0]
    # without the normaliser the large-scale task would decide alone: config 0 first
    assert suite.finalists(raw, 2) == [0, 1]


def test_over_tasks_p_improvement_and_aggregates_come_from_rliable():
    rng = np.random.default_rng(0)
    x, y = rng.random((12, 3)) + 0.5, rng.random((12, 3))
    v = suite.improvement(x, y, n_boot=300)
    assert v["p"] > 0.85 and v["ci_low"] > 0.5 and v["pvalue"] < 0.025
    same = suite.improvement(y, y, n_boot=300)
    assert same["p"] == pytest.approx(0.5) and same["pvalue"] > 0.25
    agg = suite.aggregate({"x": x, "y": y}, n_boot=300)
    assert agg["x"]["mean"][0] == pytest.approx(x.mean()) and agg["x"]["optimality gap"][0] < agg["y"]["optimality gap"][0]
    assert suite.admitted({"ppo": 0.05}, 0.0) == (False, "tuned ppo near random (0.05 < random 0.00 + 0.1)")
    assert suite.admitted({"ppo": 0.05, "ppo-lambda1": 0.9}, 0.0)[0] is False
    assert suite.admitted({"ppo": 0.4}, 0.0)[0]
    assert not suite.admitted({"ppo": 0.25}, 0.19)[0]  # umbrella-l50's case: above 0.1, but not above its random row


def test_the_report_admits_tasks_ranks_arms_and_a_clear_winner_wins(tmp_path):
    """The report's tables on made-up scores: a task where PPO is near random is not admitted, the aggregates and
    the verdict are over the admitted ones, and a method far above PPO, lambda = 1 PPO and a control wins while one
    equal to PPO does not; the glance table carries both."""
    mod = load()
    rng = np.random.default_rng(0)
    tasks = {n: suite.SuiteTask(**{**TINY, "name": n}) for n in ("a", "b", "c")}
    base = rng.random((20, 3)) * 0.2
    scores = {"random": base * 0.1, "ppo": base + [0.4, 0.4, 0.0], "ppo-lambda1": base + [0.4, 0.4, 0.0],
              "step-bonus": base + [0.4, 0.4, 0.0], "better": base + [0.9, 0.9, 0.0],
              "same": base + [0.4, 0.4, 0.0] + rng.normal(0, 0.01, (20, 3))}
    arms = list(scores)
    rows, admit, per_task = mod.task_table(scores, tasks, arms)
    assert admit == {"a": True, "b": True, "c": False} and rows[2]["admitted"].startswith("no: tuned ppo near random")
    text, agg, verdicts = mod.admitted_sections(scores, arms, tasks, admit, str(tmp_path / "suite.png"))
    assert "## Over the 2 admitted tasks" in text and (tmp_path / "suite.png").exists()
    assert {r["method"]: r["verdict"] for r in verdicts} == {"better": "wins", "same": "no"}
    assert "P(> step-bonus)" in verdicts[0]  # the control is one of the arms a method must beat
    glance = {r["arm"]: r for r in mod.glance(per_task, admit, agg, verdicts)}
    assert glance["better"]["verdict"] == "wins" and glance["admitted"]["c"] == "no"
    assert float(glance["better"]["over admitted"]) > float(glance["ppo"]["over admitted"]) + 0.4


@pytest.mark.parametrize("entry, msg", [({"nope": 1}, "unknown field 'nope'"),
                                        ({"metric": "wins"}, "metric='wins' must be one of"),
                                        ({"optimum": 0.1}, "optimum=0.1 must be above random=0.125"),
                                        ({"total_steps": 0}, "total_steps=0 must be >= 1")])
def test_an_invalid_suite_entry_is_refused_by_name(tmp_path, entry, msg):
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"tasks": [{**TINY, "name": "bad", **entry}]}))
    with pytest.raises(ConfigError, match=msg):
        suite.load_suite(str(path))


def test_an_arm_that_cannot_run_on_a_task_is_refused_before_anything_runs(tmp_path, capsys):
    """meta refuses the recurrent policy a memory task needs: the whole command stops before its first run
    (on the first task, which meta could run, nothing is written), naming the task and the reason."""
    spath = tmp_path / "suite.json"
    gru = {**TINY, "name": "tiny-gru", "static_overrides": {"network": "gru"}}
    spath.write_text(json.dumps({"tasks": [{**TINY, "name": "tiny"}, gru]}))
    out = tmp_path / "out"
    assert load().main(["--suite", str(spath), "--methods", "ppo,meta", "--stored", "none", "--protocol-check",
                        "--num-configs", "2", "--finalists", "2", "--quiet", "--out", str(out)]) == 2
    assert "task tiny-gru: meta: method 'meta' needs a feed-forward policy" in capsys.readouterr().err
    assert not out.exists()


def test_the_committed_suite_loads_and_every_task_builds():
    from coevo_jax.experiment import Study
    from coevo_jax.experiment.spec import Arm

    tasks = suite.load_suite(os.path.join(ROOT, "sweeps", "suite.json"))
    assert {t.source for t in tasks.values()} >= {"bsuite", "coevo-jax"}
    for t in tasks.values():
        Study(t.env, (Arm(t.static("ppo")),), 1, env_kwargs=dict(t.env_kwargs)).make_env()


def test_a_user_method_gets_its_row_against_the_stored_arms(tmp_path, monkeypatch, capsys):
    from coevo_jax.analysis import plots

    # each stage's study report without its default figures (tested with the runner's reports), half this test's time
    monkeypatch.setattr(plots, "study_default_plots", lambda out, report: [])
    mod = load()
    spath = tmp_path / "suite.json"
    spath.write_text(json.dumps({"tasks": [{**TINY, "name": "tiny"}]}))
    small = ["--suite", str(spath), "--protocol-check", "--num-configs", "2", "--finalists", "2",
             "--finalist-seeds", "2", "--num-seeds", "3", "--num-chunks", "1", "--quiet", "--allow-dirty"]
    first = tmp_path / "first"
    assert mod.main([*small, "--methods", "ppo", "--stored", "none", "--out", str(first)]) == 0
    plan = json.loads((first / "plan.json").read_text())
    assert plan["arms"].keys() == {"ppo"} and plan["seeds"] == {"base": 0, "count": 3}
    rows = list(csv.DictReader(open(first / "scores.csv")))
    assert {r["arm"] for r in rows} == {"ppo", "random"} and len(rows) == 6
    assert all(len(r["curve"]) == 16 if r["arm"] == "ppo" else r["curve"] == "" for r in rows)  # run fingerprints

    # from here on the library code "differs" from the stored scores': refused unless a recheck reproduces them
    old_code = rows[0]["code"]
    monkeypatch.setattr(mod.suite, "code_digest", lambda root: "0123456789abcdef")

    (tmp_path / "user_plus.py").write_text(USER_METHOD)
    monkeypatch.chdir(tmp_path)
    second = tmp_path / "second"
    try:
        argv = [*small, "--methods", "user-plus", "--import", "user_plus", "--stored",
                str(first / "scores.csv"), "--recheck-stored", "2", "--out", str(second)]
        with pytest.raises(ConfigError, match="came from other library code .*--recheck-stored K"):
            mod.setup(mod.build_parser().parse_args(argv[:-4] + argv[-2:]))  # without --recheck-stored
        assert mod.main(argv) == 0
        assert json.loads((second / "plan.json").read_text())["recheck"] == {"code": [old_code], "seeds": 2}
        # its ground-truth credit comes through its own credit function: the cue's action paid most, every cue
        lines = capsys.readouterr().out.splitlines()
        head = next(i for i, line in enumerate(lines) if line.startswith("| task | arm | spearman"))
        cells = dict(zip(*[[c.strip() for c in lines[i].split("|")[1:-1]] for i in (head, head + 2)]))
        assert cells["arm"] == "user-plus" and cells["top1"] == "1.00 [1.00, 1.00]", cells
        assert cells["gap"].startswith("0.50 ") and lines[head + 3] == ""  # plus = 0.5; one row (ppo has no credit)
        assert "re-run here on the first 2 seeds of each task reproduced bit for bit" in "\n".join(lines)
        glance = max(i for i, ln in enumerate(lines) if ln == "| arm | tiny | over admitted | verdict |")  # this run's
        assert [ln.split(" | ")[0] for ln in lines[glance + 2:glance + 6]] == ["| random", "| user-plus", "| ppo",
                                                                               "| admitted"]
        # a stored run that does not reproduce is refused by task, arm and seed
        forged = tmp_path / "forged"
        forged.mkdir()
        text = (first / "scores.csv").read_text()
        (forged / "scores.csv").write_text(text.replace(rows[1]["curve"], "f" * 16))
        args = mod.build_parser().parse_args([*small, "--methods", "user-plus", "--stored", str(forged / "scores.csv"),
                                              "--recheck-stored", "2", "--out", str(tmp_path / "fourth")])
        with pytest.raises(ConfigError, match=f"the stored ppo on tiny, seed {rows[1]['seed']}, does not reproduce"):
            mod.reproduced(args, mod.setup(args), [load_report(str(second / "recheck"))])
        # scores written before the fingerprints were kept cannot be rechecked: refused before anything runs
        (forged / "scores.csv").write_text("\n".join(",".join(line.split(",")[:6]) for line in text.splitlines()))
        with pytest.raises(ConfigError, match="keeps no run fingerprints"):
            mod.setup(args)
        # only the user's arm ran; ppo's scores are the stored ones, on the same seeds
        for stage, arm in (("recheck", "ppo"), ("tune", "user-plus"), ("finalists", "user-plus"), ("eval", "user-plus")):
            cfg = json.loads((second / stage / "config.json").read_text())  # one task: the stage folder itself
            assert [a["label"] or a["static"]["method"] for a in cfg["arms"]] == [arm], stage
        again = {(r["arm"], r["seed"]): r["score"] for r in csv.DictReader(open(second / "scores.csv"))}
        assert {k: v for k, v in again.items() if k[0] == "ppo"} == {("ppo", r["seed"]): r["score"] for r in rows
                                                                     if r["arm"] == "ppo"}
        assert json.loads((second / "plan.json").read_text())["stored_arms"] == ["ppo"]
        # every arm's pick beside the scores: the user's from this run, ppo's carried over from the stored run's
        picks = json.loads((second / "picks.json").read_text())
        assert picks.keys() == {"ppo", "user-plus"} and picks["ppo"] == json.loads((first / "picks.json").read_text())["ppo"]
        # the plan is checked after the runs: a plan edited afterwards is refused
        plan = json.loads((second / "plan.json").read_text())
        plan["arms"]["user-plus"]["lr"] *= 2
        (second / "plan.json").write_text(json.dumps(plan))
        assert mod.main([*argv, "--replot"]) == 2
        # stored scores from other settings (another budget) are refused, with the reason
        spath.write_text(json.dumps({"tasks": [{**TINY, "name": "tiny", "total_steps": 2048}]}))
        with pytest.raises(ConfigError, match="the stored scores of tiny came from other settings"):
            mod.setup(mod.build_parser().parse_args([*argv[:-2], "--out", str(tmp_path / "third")]))
    finally:
        unregister_method("user-plus")
        sys.modules.pop("user_plus", None)


def test_the_code_digest_ignores_docstrings_not_code(tmp_path):
    for pkg in ("coevo_jax", "envs_jax"):
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "m.py").write_text('"""Doc."""\n\ndef f(x):\n    """Twice."""\n    return 2 * x  # c\n')
    base = suite.code_digest(str(tmp_path))
    (tmp_path / "coevo_jax" / "m.py").write_text('"""Other doc."""\n\ndef f(x):\n    return 2 * x\n')
    assert suite.code_digest(str(tmp_path)) == base
    (tmp_path / "coevo_jax" / "m.py").write_text('"""Doc."""\n\ndef f(x):\n    return 3 * x\n')
    assert suite.code_digest(str(tmp_path)) != base
