"""Shadow-mode groundwork: a shadow release is staged and loaded as the candidate beside the
active bundle, kept across activations, promoted without download, dropped when withdrawn."""

from __future__ import annotations

import numpy as np
import pytest

from client_sdk import ModelNotLoadedError, Outcome
from client_sdk.runtime import CANDIDATE
from tests.client.onnx_models import check_whole, scaled_model

X = np.ones((1, 4), dtype=np.float32)


def test_shadow_release_runs_as_candidate_beside_the_active_bundle(make_updater, sim, runtime):
    v1, v2 = scaled_model(1.0), scaled_model(2.0)
    a1, a2 = sim.artifact(v1), sim.artifact(v2)
    sim.publish("clf", [sim.release("2.0", [a2], mode="shadow"), sim.release("1.0", [a1])])
    up = make_updater(runtime=runtime)
    result = up.check_once()
    assert result.models[0].version == "1.0" and result.models[0].outcome is Outcome.UPDATED
    assert [(c.version, c.outcome) for c in result.candidates] == [("2.0", Outcome.UPDATED)]
    assert check_whole(runtime.predict("clf", {"x": X}).outputs, X) == 1.0
    assert check_whole(runtime.predict("clf", {"x": X}, slot=CANDIDATE).outputs, X) == 2.0
    pointer = up.store.pointer("clf")
    assert pointer.candidate is not None and pointer.active != pointer.candidate
    assert up.check_once().candidates[0].outcome is Outcome.UP_TO_DATE

    # Promotion: the same release switches to active mode -> swap with no download.
    sim.publish("clf", [sim.release("2.0", [a2]), sim.release("1.0", [a1])])
    sim.fetches.clear()
    promoted = up.check_once()
    assert promoted.models[0].version == "2.0" and promoted.candidates == ()
    assert sim.fetched("/blobs/") == []
    assert up.store.pointer("clf").candidate is None
    assert runtime.predict("clf", {"x": X}).version == "2.0"
    with pytest.raises(ModelNotLoadedError):
        runtime.predict("clf", {"x": X}, slot=CANDIDATE)


def test_withdrawn_shadow_release_drops_the_candidate(make_updater, sim, runtime):
    a1, a3 = sim.artifact(scaled_model(1.0)), sim.artifact(scaled_model(3.0))
    sim.publish("clf", [sim.release("3.0", [a3], mode="shadow"), sim.release("1.0", [a1])])
    up = make_updater(runtime=runtime)
    up.check_once()
    cand = up.store.pointer("clf").candidate
    assert cand is not None
    sim.publish("clf", [sim.release("1.0", [a1])])  # the shadow release was halted
    assert up.check_once().candidates == ()
    assert up.store.pointer("clf").candidate is None
    assert not (up.store.model_dir("clf") / "bundles" / cand).exists()
    with pytest.raises(ModelNotLoadedError):
        runtime.predict("clf", {"x": X}, slot=CANDIDATE)
    assert runtime.predict("clf", {"x": X}).version == "1.0"


def test_tampered_candidate_is_refused_and_the_active_bundle_is_untouched(make_updater, sim):
    v1, v2 = scaled_model(1.0), scaled_model(2.0)
    a2 = sim.artifact(v2)
    sim.blobs["/" + a2.url] = v2[:-4] + b"evil"
    sim.publish("clf", [sim.release("2.0", [a2], mode="shadow"),
                        sim.release("1.0", [sim.artifact(v1)])])
    up = make_updater()
    result = up.check_once()
    assert result.models[0].version == "1.0"
    (c,) = result.candidates
    assert c.outcome is Outcome.REFUSED and c.error == "IntegrityError"
    assert result.verification_failed and up.store.pointer("clf").candidate is None
