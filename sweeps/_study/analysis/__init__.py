"""The studies' own analyses, on finished studies of :mod:`coevo_jax.experiment` (host side, not
part of the library): ``credit`` (SIOP's potential pictures and the KeyDoor ground-truth
correlation), ``credit_report`` / ``turn_credit`` / ``text_report`` (the learning scripts' credit,
turn and dialogue sections), ``chain_credit`` and ``credit_quality`` (learned credit against exact
ground truths), ``diagnostics`` (coevo's collusion flag and curves), ``final_policies`` (trainers
and final states of a study's runs) and ``tables`` (the results table every script prints).
"""
