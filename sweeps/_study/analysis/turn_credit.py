"""Per-turn credit on a dialogue: what SIOP and a co-evolved R_phi say about each turn.

On a turn-level dialogue env (:mod:`envs_jax.text.turns`, one action = one
utterance) a dialogue is a handful of steps, so the credit of every turn can be
read. :func:`play_dialogue` plays one dialogue with a chosen utterance per turn
(the scripted expert, a scripted failure, a policy) and records every turn's
utterance, the partner's reply, the external reward and the observations;
:func:`siop_credit` gives SIOP's per-turn credit ``F_t = gamma Phi(s_t+1) -
Phi(s_t)`` (``Phi = 0`` after a terminated turn, as in
:mod:`coevo_jax.signals.potential`), so ``sum_t gamma^t F_t = gamma^n
Phi(s_n) - Phi(s_0)``; :func:`rphi_rewards` gives a co-evolved reward's
``R_phi(x_t, a_t)`` (:mod:`coevo_jax.signals.learned`). :func:`render_credit`
writes the text table, :func:`plot_credit` the bar chart (one panel per
dialogue), and :func:`turn_credit_report` does all of it for run ``run`` of a
finished study (``Study(save_final=True)`` with a ``siop`` and / or a
``coevo-regression`` arm).

On ``TextMaze-Turns`` the maze's breadth-first-search distances give the exact
optimal advantage of every turn (:func:`maze_optimal_advantage`), to rank
SIOP's credit against (:func:`maze_credit_spearman`).
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from coevo_jax.encoding import obs_vocab
from coevo_jax.files import atomic_write_text
from coevo_jax.reward_net import make_reward_net
from coevo_jax.signals.base import flat_obs
from coevo_jax.signals.potential import potential_values
from envs_jax.text.booking import SLOT_VALUES
from envs_jax.text.maze import BLOCKED, CELLS, DIST_TO_GOAL, GOAL_CELL, MAZE_VOCAB, NEXT_CELL
from envs_jax.text.tokens import AGENT, PAD, USER, decode

from _study.analysis.credit import spearman
from _study.analysis.credit_report import _credit
from _study.analysis.final_policies import final_rollouts, run_state, trainer_for
from _study.figures import small_png


# ----------------------------------------------------------------------------- one dialogue
def play_dialogue(env, params, key, choose) -> dict:
    """Play one dialogue of the turn-level ``env`` from a reset (no auto-reset).
    ``choose(state, t) -> utterance index`` picks turn ``t``. Returns ``obs [n + 1, L]``
    (before each turn, then after the last), ``actions, rewards [n]``,
    ``utterances, replies [n]`` (text), ``opening`` (the partner's first message),
    ``terminated``, ``truncated``, ``success`` and the initial ``state``."""
    k0, key = jax.random.split(key)
    obs, state = env.reset(k0, params)
    step = jax.jit(lambda k, s, a: env.step_env(k, s, a, params))
    vocab, utts = env.vocab, env.grammar.utterances
    first = state
    rec = {"obs": [np.asarray(obs)], "actions": [], "rewards": [], "utterances": [], "replies": []}
    terminated = truncated = success = False
    for t in range(int(params.max_steps_in_episode)):
        a = int(choose(state, t))
        key, ks = jax.random.split(key)
        obs, nstate, r, term, info = step(ks, state, jnp.int32(a))
        start = int(state.pos) + int(np.sum(np.asarray(env.grammar.table_np[a]) != PAD))
        reply = [x for x in np.asarray(nstate.buf)[start:int(nstate.pos)] if x not in (USER, AGENT)]
        rec["obs"].append(np.asarray(obs))
        rec["actions"].append(a)
        rec["rewards"].append(float(r))
        rec["utterances"].append(utts[a].replace(" <eot>", ""))
        rec["replies"].append(decode(vocab, reply))
        terminated, success = bool(term), bool(info["success"])
        truncated = not terminated and int(nstate.time) >= int(params.max_steps_in_episode)
        state = nstate
        if terminated or truncated:
            break
    opening = [x for x in np.asarray(first.buf)[:int(first.pos)] if x not in (USER, AGENT)]
    return {"obs": np.stack(rec["obs"]), "actions": np.asarray(rec["actions"], np.int32),
            "rewards": np.asarray(rec["rewards"], np.float64), "utterances": rec["utterances"],
            "replies": rec["replies"], "opening": decode(vocab, opening), "terminated": terminated,
            "truncated": truncated, "success": success, "state": first}


def expert_chooser(env, params):
    """The env's scripted expert (``env.expert_action``)."""
    f = jax.jit(lambda s: env.expert_action(s, params))
    return lambda state, t: int(f(state))


def booking_failure_chooser(env):
    """A failed Booking dialogue: ask the first two slots, then propose them with a wrong
    price and size, then say bye (user: ``no price``, then the episode ends with -1)."""

    def choose(state, t):
        goal = np.asarray(state.goal)
        if t < 2:
            return t  # ask cuisine, ask area
        if t == 2:
            vals = [SLOT_VALUES[i][(int(g) + (1 if i >= 2 else 0)) % len(SLOT_VALUES[i])] for i, g in enumerate(goal)]
            return env.grammar.utterances.index("propose " + " ".join(vals) + " <eot>")
        return env.grammar.utterances.index("bye <eot>")

    return choose


def random_failure(env, params, key, tries: int = 32) -> dict:
    """The first dialogue of the uniform-random policy (NumPy seeds ``0, 1, ...``; every try
    from the reset of ``key``) that does not succeed."""
    for i in range(tries):
        rng = np.random.default_rng(i)
        d = play_dialogue(env, params, key, lambda s, t: int(rng.integers(env.num_utterances)))
        if not d["success"]:
            return d
    raise RuntimeError(f"{tries} random dialogues all succeeded")


def example_dialogues(env, params, key) -> dict:
    """``{"example (scripted expert)": the expert's dialogue, "failed (...)": a failed one}``,
    both from the reset of ``key`` (Booking: :func:`booking_failure_chooser`; other envs:
    :func:`random_failure`)."""
    out = {"example (scripted expert)": play_dialogue(env, params, key, expert_chooser(env, params))}
    if env.token_env.name == "Booking":
        out["failed (scripted)"] = play_dialogue(env, params, key, booking_failure_chooser(env))
    else:
        out["failed (uniform random)"] = random_failure(env, params, key)
    return out


# ----------------------------------------------------------------------------- credit
def siop_credit(phi: np.ndarray, gamma: float, terminated: bool) -> np.ndarray:
    """Per-turn potential-based credit ``[n]`` from ``phi [n + 1]`` (the potential before each
    turn and after the last): ``gamma phi[t+1] - phi[t]``, with ``phi[n] = 0`` if the
    dialogue terminated (a time-out bootstraps with ``phi[n]``)."""
    phi = np.asarray(phi, np.float64).copy()
    if terminated:
        phi[-1] = 0.0
    return gamma * phi[1:] - phi[:-1]


def potential_of(static, signal_state, obs: np.ndarray, vocab: int) -> np.ndarray:
    """SIOP's trained ``Phi`` over dialogue buffers ``obs [B, L]`` of ``vocab`` token classes: ``[B]``."""
    return np.asarray(jax.jit(lambda o: potential_values(static, signal_state, o, 1, vocab))(jnp.asarray(obs)))


def rphi_rewards(trainer, policy_params, reward_params, obs: np.ndarray, actions: np.ndarray) -> np.ndarray:
    """A co-evolved ``R_phi(x_t, a_t)`` ``[n]`` on the turns ``obs [n, L]``, ``actions [n]``
    (``x_t``: the policy's features of ``obs_t``, or the observation, as its
    ``RewardNetStatic.reward_input`` says)."""
    net = make_reward_net(trainer.static, trainer.env, trainer.env_params)

    def f(o, a):
        x = trainer.network.apply(policy_params, o)[2] if net.reward_input == "features" else flat_obs(o, 1)
        return net.apply(reward_params, x.astype(jnp.float32), a)[0]

    return np.asarray(jax.jit(f)(jnp.asarray(obs), jnp.asarray(actions, jnp.int32)))


# ----------------------------------------------------------------------------- text and figure
def outcome(d: dict) -> str:
    kind = "success" if d["success"] else ("time-out" if d["truncated"] else "failure")
    return f"{kind}, return {d['rewards'].sum():+.2f} after {len(d['actions'])} turns"


def render_credit(d: dict, title: str, credit=None, phi=None, rphi=None, gamma: float = 0.99) -> str:
    """One dialogue as a text table: per turn the agent's utterance, the partner's reply, the
    external reward, SIOP's ``Phi(s_t)`` and credit and ``R_phi``; then the outcome and sums."""
    dash = lambda x, t: "-" if x is None else f"{x[t]:+.3f}"  # noqa: E731
    wu, wr = (max(12, *(len(x) for x in d[k])) for k in ("utterances", "replies"))
    lines = [f"{title}: {outcome(d)}", f"user opens: {d['opening']}",
             f"{'turn':>4}  {'agent says':<{wu}}  {'user replies':<{wr}} {'r_ext':>6} {'Phi(s_t)':>8}"
             f" {'SIOP credit':>11} {'R_phi':>7}"]
    for t, (u, rep) in enumerate(zip(d["utterances"], d["replies"])):
        lines.append(f"{t + 1:>4}  {u:<{wu}}  {rep or '-':<{wr}} {d['rewards'][t]:>+6.2f} {dash(phi, t):>8}"
                     f" {dash(credit, t):>11} {dash(rphi, t):>7}")
    if credit is not None:
        n = len(credit)
        end = 0.0 if d["terminated"] else phi[n]
        disc = float(np.sum(gamma ** np.arange(n) * credit))
        lines.append(f"sum_t gamma^t credit = {disc:+.3f} = gamma^n Phi(end) - Phi(start) = "
                     f"{gamma ** n * end:+.3f} - ({phi[0]:+.3f})")
    if rphi is not None:
        lines.append(f"sum_t R_phi = {float(np.sum(rphi)):+.3f} (fit to the external return {d['rewards'].sum():+.2f})")
    return "\n".join(lines)


def plot_credit(panels: list, path: str, title: str = "per-turn credit") -> str:
    """Bar chart, one panel per dialogue: ``panels = [(name, dialogue, credit or None, rphi
    or None)]``; bars per turn (SIOP credit, R_phi), the external reward as stars;
    the x labels are the turns' utterances and replies."""
    from coevo_jax.analysis.plots import save_figure, subplots  # a bare Figure: matplotlib's state untouched

    fig, axes = subplots(1, len(panels), figsize=(5.2 * len(panels), 4.2), squeeze=False)
    for ax, (name, d, credit, rphi) in zip(axes[0], panels):
        n = len(d["actions"])
        x = np.arange(n)
        w = 0.38 if credit is not None and rphi is not None else 0.6
        if credit is not None:
            ax.bar(x - (w / 2 if rphi is not None else 0), credit, w, color="tab:blue", label="SIOP credit")
        if rphi is not None:
            ax.bar(x + (w / 2 if credit is not None else 0), rphi, w, color="tab:orange",
                   label="R_phi (coevo-regression)")
        nz = np.nonzero(d["rewards"])[0]
        ax.scatter(nz, d["rewards"][nz], color="tab:green", marker="*", s=120, zorder=3, label="external reward")
        ax.axhline(0.0, color="k", lw=0.5)
        ax.set_xticks(x)
        ax.set_xticklabels([u.replace("propose ", "propose\n") + "\n> " + r for u, r in zip(d["utterances"],
                                                                                             d["replies"])], fontsize=7)
        ax.set_title(f"{name}: {outcome(d)}", fontsize=9)
        ax.set_ylabel("per-turn credit / reward")
        ax.legend(fontsize=7, loc="best")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return small_png(save_figure(fig, path, dpi=90))


# ----------------------------------------------------------------------------- a study's final models
def turn_credit_report(result, run: int = 0, out: str | None = None, seed: int = 0,
                       siop: str = "siop", coevo: str = "coevo-regression") -> str:
    """The credit of run ``run``'s final SIOP potential (arm ``siop``) and R_phi (arm ``coevo``)
    on :func:`example_dialogues` (reset key ``PRNGKey(seed)``). Writes ``turn_credit.png``
    and ``turn_credit.txt`` to ``out`` (default: the study folder); returns the text
    (``""`` when the study has neither arm)."""
    labels = {a.name for a in result.study.arms}
    if siop not in labels and coevo not in labels:
        return ""
    out = out or result.out
    env, params = result.study.make_env()
    dialogues = example_dialogues(env, params, jax.random.PRNGKey(seed))
    gamma, models = 0.99, {}
    if siop in labels:
        gamma = float(result.hparams(siop).ppo.gamma[run])
        models[siop] = (trainer_for(result, siop), run_state(result.final_states(siop), run))
    if coevo in labels:
        models[coevo] = (trainer_for(result, coevo), run_state(result.final_states(coevo), run))
    texts, panels = [], []
    for name, d in dialogues.items():
        credit = phi = rphi = None
        if siop in models:
            trainer, state = models[siop]
            phi = potential_of(trainer.static, state.signal_state, d["obs"], obs_vocab(trainer.env, trainer.env_params))
            credit = siop_credit(phi, gamma, d["terminated"])
        if coevo in models:
            trainer, state = models[coevo]
            rphi = rphi_rewards(trainer, state.params, state.signal_state.params, d["obs"][:-1], d["actions"])
        texts.append(render_credit(d, f"{name} dialogue", credit, phi, rphi, gamma))
        panels.append((name, d, credit, rphi))
    title = f"{result.study.env}: per-turn credit of run {run}'s final SIOP potential and R_phi"
    path = plot_credit(panels, os.path.join(out, "turn_credit.png"), title)
    text = f"# {title}\n\n" + "\n\n".join(texts)
    atomic_write_text(os.path.join(out, "turn_credit.txt"), text + "\n")
    return text + f"\n\nfigure: {os.path.relpath(path)}"


# ----------------------------------------------------------------------------- TextMaze: the exact advantage
def maze_optimal_advantage(cell: np.ndarray, action: np.ndarray, gamma: float) -> np.ndarray:
    """``A*(s, a) = Q*(s, a) - V*(s)`` of ``TextMaze(-Turns)`` with its default reward table
    (-1 per move, -4 into a wall, 0 on the move that reaches the goal, which ends the
    episode), from the breadth-first-search distances; the time limit is ignored.
    ``cell, action`` int arrays of the same shape (cell: index into ``CELLS``)."""
    d = DIST_TO_GOAL.astype(np.float64)
    v = -(1.0 - gamma ** np.maximum(d - 1, 0)) / (1.0 - gamma)  # d - 1 paid moves, then the free one
    v[GOAL_CELL] = 0.0
    cell, action = np.asarray(cell), np.clip(np.asarray(action), 0, 3)
    nxt = NEXT_CELL[cell, action]
    q = np.where(BLOCKED[cell, action], -4.0 + gamma * v[cell], np.where(nxt == GOAL_CELL, 0.0, -1.0 + gamma * v[nxt]))
    return np.round(q - v[cell], 9)  # optimal moves tie at exactly 0 (ranks must not split them on float noise)


def maze_cells(obs: np.ndarray) -> np.ndarray:
    """The agent's cell (index into ``CELLS``) in each fully observed ``TextMaze`` buffer
    ``obs [..., L]``: the last ``pos <x> <y>`` the user said."""
    index = {c: i for i, c in enumerate(CELLS)}
    digit = {MAZE_VOCAB[str(i)]: i for i in range(7)}
    flat = np.asarray(obs).reshape(-1, np.shape(obs)[-1])
    out = np.empty(len(flat), np.int64)
    for i, row in enumerate(flat):
        p = np.nonzero(row == MAZE_VOCAB["pos"])[0][-1]
        out[i] = index[(digit[int(row[p + 1])], digit[int(row[p + 2])])]
    return out.reshape(np.shape(obs)[:-1])


def maze_credit_spearman(result, label: str = "siop", key=None) -> np.ndarray:
    """Per run of arm ``label`` (SIOP): Spearman correlation of its raw credit with the exact
    optimal advantage over one rollout of its final policy on ``TextMaze-Turns``. ``[R]``."""
    key = jax.random.PRNGKey(99) if key is None else key
    trainer = trainer_for(result, label)
    states, hp = result.final_states(label), result.hparams(label)
    traj = final_rollouts(trainer, states, key, trainer.static.rollout_len)
    credit = np.asarray(jax.jit(jax.vmap(lambda s, t, h: _credit(trainer.static, s, t, h)))(
        states.signal_state, traj, hp))
    gamma = np.asarray(hp.ppo.gamma, np.float64)
    return np.array([spearman(credit[r], maze_optimal_advantage(maze_cells(traj.obs[r]), traj.action[r], gamma[r]))
                     for r in range(credit.shape[0])], np.float64)

