"""One chooser: the detectors a trainer runs in-process choose a run's profile from the model's
architecture signature exactly as the worker does from the run's ``start`` record, so a
user's profile published for their model judges its runs in the trainer too — with no label —
and the warnings, the log and the ``end`` record say which profile and why."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_integrations import (
    EVERY,
    WARNED,
    hf_train,
    lightning_train,
    plumbing_config,
    tiny_mixtral,
)

from foreshock.detectors.profiles import ProfileConfigs, merged, shipped_profiles
from foreshock.detectors.signatures import signature_of
from foreshock.producers.sinks import ListSink
from foreshock.transport.run_files import load_run


def users_profiles(model) -> ProfileConfigs:
    """The shipped profiles and a user's profile ``mine`` made for ``model``'s architecture
    (a plumbing config: it warns on cue at step ``WARNED``)."""
    from foreshock.producers.monitor import Monitor

    monitor = Monitor(model, ListSink(), run_id="signature")
    signature = signature_of({"monitor": {"signature": monitor.signature()}})  # as calibrate's
    monitor.close()
    assert signature is not None
    return merged(
        shipped_profiles(), ProfileConfigs({"mine": plumbing_config()}, {"mine": [signature]})
    )


def check(path: Path, feed, caplog) -> None:
    detector = feed.detector
    assert detector is not None and detector.profile.name == "mine", detector.profile
    assert "calibrated on" in detector.profile.reason
    opened = [a for a in detector.alerts if a.step == WARNED]
    assert opened and all(a.evidence["profile"] == "mine" for a in opened)
    assert load_run(path).end["profile"]["name"] == "mine"
    assert any("judged by profile mine" in r.message for r in caplog.records)


@pytest.mark.slow
def test_a_users_profile_judges_an_hf_run_in_process_with_no_label(tmp_path, caplog):
    pytest.importorskip("transformers")
    from foreshock.integrations.huggingface import ForeshockCallback

    caplog.set_level(logging.INFO, logger="foreshock")
    path = tmp_path / "hf.jsonl"
    warnings = users_profiles(tiny_mixtral())
    callback = ForeshockCallback(path, run_id="hf-mine", every=EVERY, warnings=warnings)
    hf_train(tmp_path, callback, make_model=tiny_mixtral)
    check(path, callback.feed, caplog)


def test_a_users_profile_judges_a_lightning_run_in_process_with_no_label(tmp_path, caplog):
    pytest.importorskip("lightning")
    from test_integrations import SEQ

    from foreshock.integrations.lightning import ForeshockLightningCallback
    from foreshock.lab.model import GPT, GPTConfig

    caplog.set_level(logging.INFO, logger="foreshock")
    model = GPT(GPTConfig(block_size=SEQ, n_layer=1, n_head=2, n_embd=32, n_experts=4))
    path = tmp_path / "pl.jsonl"
    callback = ForeshockLightningCallback(
        path, run_id="pl-mine", every=EVERY, warnings=users_profiles(model)
    )
    lightning_train(callback)
    check(path, callback.feed, caplog)
