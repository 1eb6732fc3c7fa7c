"""The output folder: new, resumable or refused. A finished study, another config's checkpoints or a
folder that is not a study's are refused unless ``overwrite``; files are written atomically."""
from __future__ import annotations

import json
import os
import shutil
import time

from coevo_jax.experiment.spec import CONFIG_VERSION, StudyError, config_hash
from coevo_jax.files import atomic_write_text

FINISHED_MARK = "FINISHED"


def read_json(path: str, default=None):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return default


def _check_writable(out: str) -> None:
    """:class:`StudyError` (one line) unless ``out`` can be created and written."""
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, f".write_probe{os.getpid()}")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError as e:
        raise StudyError(f"cannot write to --out {out}: {e.strerror or e}") from None


def check_out(out: str, text: str, overwrite: bool) -> str:
    """``"new"``, ``"resume"`` or ``"wipe"`` for ``out`` and the study whose ``config.json`` is ``text``;
    :class:`StudyError` (one line) for the refused cases."""
    if os.path.exists(out) and not os.path.isdir(out):
        raise StudyError(f"{out} exists and is not a folder")
    if not os.path.exists(out) or not os.listdir(out):
        _check_writable(out)
        return "new"
    old = os.path.join(out, "config.json")
    if not os.path.exists(old):
        raise StudyError(f"{out} exists and is not a study's output folder (no config.json); choose another --out")
    _check_writable(out)
    if os.path.exists(os.path.join(out, FINISHED_MARK)):
        if overwrite:
            return "wipe"
        raise StudyError(f"{out} holds a finished study; pass --overwrite to replace it, or choose another --out")
    old_text = open(old).read()
    old_hash = config_hash(old_text)
    if old_hash != config_hash(text):
        if overwrite:
            return "wipe"
        version = _version(old_text)
        if version != CONFIG_VERSION:
            raise StudyError(f"{out} was written by an older version of coevo_jax.experiment (config.json version"
                             f" {version}, now {CONFIG_VERSION}) and cannot be resumed; use a new --out")
        raise StudyError(f"checkpoint in {out} is from a different config (hash {old_hash} != {config_hash(text)});"
                         " refusing to resume it: pass --overwrite to discard it, or choose another --out")
    return "resume"


def _version(text: str):
    """The ``version`` of a ``config.json`` text (``None`` when it has none or is no JSON object)."""
    try:
        d = json.loads(text)
    except ValueError:
        return None
    return d.get("version") if isinstance(d, dict) else None


def wait_prepared(out: str, text: str, timeout_s: float = 600.0) -> None:
    """On a host other than 0: wait until host 0 has prepared ``out`` for this study."""
    want, deadline = json.loads(text), time.time() + timeout_s
    while os.path.exists(os.path.join(out, FINISHED_MARK)) or read_json(os.path.join(out, "config.json")) != want:
        if time.time() > deadline:
            raise StudyError(f"host 0 did not prepare {out} for this study within {timeout_s:.0f} s")
        time.sleep(0.5)


def prepare_out(out: str, text: str, action: str) -> None:
    """Create (or wipe) ``out`` and write ``config.json``."""
    if action == "wipe":
        shutil.rmtree(out)
    os.makedirs(os.path.join(out, "checkpoints"), exist_ok=True)
    if action != "resume":
        atomic_write_text(os.path.join(out, "config.json"), text)
