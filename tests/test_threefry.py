"""Threefry unrolled on CPU (envs_jax/_threefry.py): the same random bits as JAX's
rolled CPU lowering, and no loop left in the compiled hash."""
from __future__ import annotations

import os
import subprocess
import sys

import jax
import numpy as np

import envs_jax  # noqa: F401  (registers the lowering)
from envs_jax import _threefry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

DRAWS = """
import sys
sys.path.insert(0, {root!r})
import jax, jax.numpy as jnp, numpy as np
import envs_jax

def draws(key):
    k1, k2 = jax.random.split(key)
    keys = jax.random.split(k1, 5)
    return (keys, jax.vmap(lambda k: jax.random.uniform(k, (3,)))(keys),
            jax.random.categorical(k2, jnp.linspace(-1.0, 1.0, 7), shape=(4,)),
            jax.random.permutation(k2, 11), jax.random.normal(k2, (2, 3)))

out = jax.jit(jax.vmap(draws))(jax.random.split(jax.random.PRNGKey(3), 4))
np.savez(sys.argv[1], *[np.asarray(x) for x in out])
print("while" in jax.jit(jax.random.split).lower(jax.random.PRNGKey(0)).as_text())
"""


def _draws(tmp_path, name: str, rolled: bool):
    env = dict(os.environ)
    env.pop("COEVO_JAX_ROLLED_THREEFRY", None)
    if rolled:
        env["COEVO_JAX_ROLLED_THREEFRY"] = "1"
    path = str(tmp_path / f"{name}.npz")
    out = subprocess.run([sys.executable, "-c", DRAWS.format(root=ROOT), path], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    has_loop = out.stdout.strip().splitlines()[-1] == "True"
    with np.load(path) as f:
        return [f[k] for k in sorted(f.files, key=lambda k: int(k.split("_")[1]))], has_loop


def test_unrolled_threefry_gives_the_rolled_loops_bits(tmp_path):
    rolled, rolled_loop = _draws(tmp_path, "rolled", rolled=True)
    unrolled, unrolled_loop = _draws(tmp_path, "unrolled", rolled=False)
    assert rolled_loop and not unrolled_loop  # JAX's CPU default loops; ours does not
    for a, b in zip(rolled, unrolled):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def test_registered_in_this_process_unless_opted_out():
    assert _threefry.UNROLLED == (os.environ.get("COEVO_JAX_ROLLED_THREEFRY") != "1")
    if _threefry.UNROLLED:
        assert "while" not in jax.jit(jax.random.split).lower(jax.random.PRNGKey(0)).as_text()
