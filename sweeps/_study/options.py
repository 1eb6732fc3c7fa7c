"""The options the scripts in ``sweeps/`` share beyond :func:`_study.cli.study_parser`: comma lists, HParams values and grids, the study options.

Every function raises :class:`~coevo_jax.config.ConfigError` naming the option,
so :func:`_study.cli.main` turns a bad value into one line on
stderr and exit status 2.
"""
from __future__ import annotations

from coevo_jax.config import ConfigError, hparam_fields


def names(text: str, option: str, choices=None) -> list[str]:
    """``"a,b"`` -> ``["a", "b"]`` (distinct, in order, at least one; each in ``choices`` when given)."""
    out = list(dict.fromkeys(t.strip() for t in text.split(",") if t.strip()))
    if not out:
        raise ConfigError(f"{option} needs at least one entry")
    bad = [n for n in out if choices is not None and n not in choices]
    if bad:
        raise ConfigError(f"{option}: unknown {bad[0]!r}; choose from {', '.join(choices)}")
    return out


def _number(option: str, field: str, text: str) -> float:
    if field not in hparam_fields():
        raise ConfigError(f"{option}: unknown HParams field {field!r}")
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{option}: {field}={text!r} is not a number") from None


def hp_values(text: str, option: str) -> dict:
    """``"a=1,b=2e-3"`` -> ``{"a": 1.0, "b": 0.002}`` (HParams fields only; ``""`` -> ``{}``)."""
    out = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        field, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"{option}: {item!r} is not field=value")
        out[field.strip()] = _number(option, field.strip(), value.strip())
    return out


def hp_grid(text: str, option: str) -> dict:
    """``"a=1,2;b=3"`` -> ``{"a": (1.0, 2.0), "b": (3.0,)}`` (an :class:`~coevo_jax.experiment.Arm` grid)."""
    out = {}
    for part in filter(None, (t.strip() for t in text.split(";"))):
        field, eq, values = part.partition("=")
        if not eq or not values.strip():
            raise ConfigError(f"{option}: {part!r} is not field=v1,v2,...")
        out[field.strip()] = tuple(_number(option, field.strip(), v) for v in values.split(",") if v.strip())
    return out


def per_key_ints(text: str, keys, option: str, low: int = 1) -> dict:
    """``"500"`` (every key) or ``"a=500,b=600"`` -> ``{key: int}`` for each of ``keys`` (each >= ``low``)."""
    try:
        if "=" not in text:
            out = {k: int(text) for k in keys}
        else:
            out = {k.strip(): int(v) for k, v in (item.split("=") for item in text.split(",") if item.strip())}
    except ValueError:
        raise ConfigError(f"{option}={text!r} must be an integer or key=integer pairs") from None
    missing = [k for k in keys if k not in out]
    if missing:
        raise ConfigError(f"{option}: no value for {missing[0]!r}")
    bad = [k for k in keys if out[k] < low]
    if bad:
        raise ConfigError(f"{option}: {bad[0]}={out[bad[0]]} must be >= {low}")
    return {k: out[k] for k in keys}


def add_study_options(parser, num_seeds: int | None, threshold: float | None = None,
                      what: str = "success rate") -> None:
    """Add the options every learning script has: ``--num-seeds`` (unless ``num_seeds``
    is None: the script words its own), ``--threshold`` (when the script takes one;
    ``what`` names its metric), ``--num-chunks``, ``--seed``."""
    if num_seeds is not None:
        parser.add_argument("--num-seeds", type=int, default=num_seeds, metavar="N",
                            help=f"seeds per arm and grid point, >= 1 (default: {num_seeds})")
    if threshold is not None:
        parser.add_argument("--threshold", type=float, default=threshold,
                            help=f"{what} for steps-to-threshold, fixed in advance (default: {threshold:g})")
    parser.add_argument("--num-chunks", type=int, default=8, metavar="C",
                        help="checkpointed chunks per run (default: 8)")
    parser.add_argument("--seed", type=int, default=0, help="base seed, >= 0 (default: 0)")
