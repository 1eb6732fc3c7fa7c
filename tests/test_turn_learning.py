"""sweeps/turn_learning.py (its options and default studies) and the per-turn credit
pictures of _study.analysis.turn_credit (dialogues, telescoping credit, text, R_phi,
the exact TextMaze advantage)."""
import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import envs_jax
from xla_options import OPT0

from _study.analysis import turn_credit as tc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load():
    path = os.path.join(ROOT, "sweeps", "turn_learning.py")
    spec = importlib.util.spec_from_file_location("sweep_turn_learning", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def booking():
    env, params = envs_jax.make("Booking-Turns")
    return env, params, tc.example_dialogues(env, params, jax.random.PRNGKey(3))


@pytest.mark.parametrize("argv, msg", [
    (["--envs", "Booking"], "--envs: unknown 'Booking'"),
    (["--methods", "ppo,nonsense"], "--methods: unknown 'nonsense'"),
    (["--total-steps", "10"], "--total-steps: Booking-Turns=10 must be >= 512"),
    (["--total-steps", "Booking-Turns=4096"], "--total-steps: no value for 'TwentyQuestions-Turns'"),
    (["--expert-episodes", "0"], "--expert-episodes=0"),
    (["--num-seeds", "0"], "--num-seeds=0 must be >= 1"),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, msg, tmp_path, capsys):
    out = str(tmp_path / "x")
    assert load().main(argv + ["--out", out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("turn_learning.py: error:") and msg in err, err
    assert not os.path.exists(out)


def test_default_studies_and_help():
    from coevo_jax.config import default_hparams
    from coevo_jax.registry import registered_methods

    from _study import cli

    mod = load()
    parser = mod.build_parser()
    shared = {a.dest for a in cli.study_parser("x", "", "out")._actions}
    assert all("default" in (a.help or "") for a in parser._actions if a.dest not in shared)
    # without an admitted task: every arm at the env's base values
    booking, twenty = mod.studies(parser.parse_args(["--admitted", os.path.join(ROOT, "no-such-file.json")]))
    assert [booking.env, twenty.env] == ["Booking-Turns", "TwentyQuestions-Turns"]
    for s, mb, hp in ((booking, 4, {"lr": 1e-3, "ent_coef": 0.01}), (twenty, 8, {"lr": 5e-3, "ent_coef": 0.05})):
        assert s.num_seeds >= 16 and s.threshold == 0.8 and s.save_final
        assert [a.name for a in s.arms] == ["ppo", "dense", "siop", "siop-critic", "coevo-regression", "coevo-ranking", "meta"]
        assert set(a.name for a in s.arms) <= set(registered_methods())
        for a in s.arms:  # same base lr / ent / network for every arm, the rest at the library defaults
            assert dict(a.fixed) == hp and a.static.network == "bag" and a.static.action_head == "utterance"
            assert a.static.num_envs == 16 and a.static.num_minibatches == mb and not a.grid
    assert float(default_hparams("siop").signal.normalize_int) == 0.0  # (siop's own default is kept, not overridden)
    # with the admitted booking-turns task: each method at its own tuned values (or PPO's) and the task's shape
    task = mod.load_admitted(parser.parse_args([]).admitted)["booking-turns"]
    tuned, same = mod.studies(parser.parse_args([]))
    assert [a.name for a in tuned.arms] == [a.name for a in booking.arms] and same.arms == twenty.arms
    for a in tuned.arms:
        assert dict(a.fixed) == task.hparams(a.name) and a.static == task.static(a.name), a.name
        assert a.static == booking.arms[[b.name for b in booking.arms].index(a.name)].static
    assert any(dict(a.fixed) != dict(b.fixed) for a, b in zip(tuned.arms, booking.arms))
    maze, = mod.studies(parser.parse_args(["--envs", "TextMaze-Turns", "--methods", "siop", "--total-steps", "1024"]))
    assert maze.arms[0].static.total_steps == 1024


def test_dialogues_text_and_telescoping_credit(booking):
    env, params, ds = booking
    (name_ok, ok), (name_bad, bad) = ds.items()
    assert ok["success"] and ok["terminated"] and ok["rewards"].sum() == 1.0
    assert ok["utterances"][:4] == ["ask cuisine", "ask area", "ask price", "ask size"]
    assert ok["utterances"][-1].startswith("propose") and ok["replies"][-1] == "yes booked"
    assert not bad["success"] and bad["terminated"] and bad["rewards"].sum() == -1.0
    assert bad["utterances"][-1] == "bye" and bad["replies"][2].startswith("no ")
    assert len(ok["obs"]) == len(ok["actions"]) + 1
    gamma = 0.9
    for d in (ok, bad):
        n = len(d["actions"])
        phi = np.random.default_rng(0).normal(size=n + 1)
        credit = tc.siop_credit(phi, gamma, d["terminated"])
        assert np.sum(gamma ** np.arange(n) * credit) == pytest.approx(0.0 - phi[0])  # Phi(end) = 0: terminated
        rphi = np.linspace(-0.5, 0.5, n)
        text = tc.render_credit(d, "x", credit, phi, rphi, gamma)
        lines = text.splitlines()
        for t, (u, rep) in enumerate(zip(d["utterances"], d["replies"])):
            row = next(line for line in lines if line.split()[:1] == [str(t + 1)])
            assert u in row and rep in row and f"{credit[t]:+.3f}" in row and f"{rphi[t]:+.3f}" in row
        assert ("success" if d["success"] else "failure") in lines[0] and "sum_t gamma^t credit" in text
    # a time-out keeps gamma^n Phi(end)
    phi = np.array([0.2, -0.1, 0.4])
    assert np.sum(0.9 ** np.arange(2) * tc.siop_credit(phi, 0.9, False)) == pytest.approx(0.81 * 0.4 - 0.2)


def test_trained_models_credit_and_figure(booking, tmp_path):
    """A (hand-built) SIOP potential and an untrained R_phi on the example dialogue."""
    from coevo_jax.config import static_config
    from coevo_jax.reward_net import make_reward_net
    from coevo_jax.signals.potential import PotentialState, init_potential_params, make_potential_network
    from coevo_jax.train import Trainer

    env, params, ds = booking
    d = next(iter(ds.values()))
    core = dict(network="bag", action_head="utterance", num_envs=2, rollout_len=4, total_steps=8, num_minibatches=1,
                update_epochs=1, d_model=8, hidden_sizes=(8,))
    static, siop = static_config("coevo-regression", **core, reward_hidden=(8,)), static_config("siop", **core)
    vocab = env.vocab_size
    vnet = make_potential_network(siop, vocab)
    params0 = init_potential_params(vnet, jax.random.PRNGKey(0), jnp.zeros((1, d["obs"].shape[1]), jnp.int32), 0.5, 1)
    state = PotentialState(params0, None, None, None, None)
    phi = tc.potential_of(siop, state, d["obs"], vocab)
    assert phi.shape == (len(d["obs"]),) and np.allclose(phi, 0.5, atol=0.05)  # init: the bias potential_init
    trainer = Trainer(static, env, params)
    pp = jax.jit(trainer.network.init, compiler_options=OPT0)(jax.random.PRNGKey(1), jnp.asarray(d["obs"][:1]))
    net = make_reward_net(static, trainer.env, params)
    rp = jax.jit(net.init, compiler_options=OPT0)(jax.random.PRNGKey(2), jnp.zeros((1, 8)), jnp.zeros((1,), jnp.int32))
    rphi = tc.rphi_rewards(trainer, pp, rp, d["obs"][:-1], d["actions"])
    assert rphi.shape == d["actions"].shape and np.all(np.abs(rphi) < 0.05)
    credit = tc.siop_credit(phi, 0.99, True)
    path = tc.plot_credit([(n, x, credit if x is d else None, rphi if x is d else None) for n, x in ds.items()],
                          str(tmp_path / "c.png"))
    assert os.path.getsize(path) > 1000


def test_maze_exact_advantage_and_cells():
    from envs_jax.text.maze import BLOCKED, CELLS, DIST_TO_GOAL, GOAL_CELL, NEXT_CELL

    env, params = envs_jax.make("TextMaze-Turns")
    obs, state = env.reset(jax.random.PRNGKey(0), params)
    assert tc.maze_cells(np.asarray(obs)[None])[0] == int(state.cell)
    d = tc.play_dialogue(env, params, jax.random.PRNGKey(0), tc.expert_chooser(env, params))
    cells = tc.maze_cells(d["obs"][:-1])
    assert d["success"] and len(d["actions"]) == DIST_TO_GOAL[cells[0]]
    assert np.all(tc.maze_optimal_advantage(cells, d["actions"], np.float32(0.99)) == 0.0)  # the expert: exactly 0
    cell = np.repeat(np.arange(len(CELLS)), 4)
    action = np.tile(np.arange(4), len(CELLS))
    adv = tc.maze_optimal_advantage(cell, action, 0.99).reshape(-1, 4)
    keep = np.arange(len(CELLS)) != GOAL_CELL
    assert np.all(adv[keep].max(1) == pytest.approx(0.0)) and np.all(adv[keep] <= 1e-9)
    worse = (DIST_TO_GOAL[NEXT_CELL] >= DIST_TO_GOAL[:, None]) | BLOCKED
    assert np.all(adv[keep][worse[keep]] < 0)  # every move that does not get closer loses value
