"""Each model's pointer.json is read once per update cycle, whatever the cycle does: install
with a candidate (no pointer yet: no read), stay up to date, promote the candidate, roll back,
stage and drop a candidate.

Counted with audit hooks on real file opens (tests.support.audit), across two models."""

from __future__ import annotations

from pathlib import Path

from client_sdk import ModelRuntime, Outcome
from tests.client.onnx_models import scaled_model
from tests.support.audit import reads_of, recording


def _reads_per_model(log: list[tuple[str, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for path in reads_of(log, "pointer.json"):
        model = Path(path).parent.name
        counts[model] = counts.get(model, 0) + 1
    return counts


def test_pointer_json_is_read_once_per_model_per_cycle(make_updater, sim, tmp_path):
    a = {v: sim.artifact(scaled_model(v)) for v in (1.0, 2.0, 3.0)}
    b1 = sim.artifact(scaled_model(5.0))
    runtime = ModelRuntime(tmp_path / "device")
    up = make_updater(runtime=runtime)

    def cycle(clf: list, expect: Outcome) -> dict[str, int]:
        sim.publish("clf", clf)
        sim.publish("det", [sim.release("1.0", [b1])])
        with recording() as log:
            result = up.check_once()
        assert result.models[0].outcome is expect, result
        return _reads_per_model(log)

    once = {"clf": 1, "det": 1}
    shadow2 = [sim.release("2.0", [a[2.0]], mode="shadow"), sim.release("1.0", [a[1.0]])]
    assert cycle(shadow2, Outcome.UPDATED) == {}              # install + stage a candidate
    assert up.store.pointer("clf").candidate is not None
    assert cycle(shadow2, Outcome.UP_TO_DATE) == once         # nothing to do
    promoted = [sim.release("2.0", [a[2.0]]), sim.release("1.0", [a[1.0]])]
    assert cycle(promoted, Outcome.UPDATED) == once           # candidate promoted, no download
    assert cycle([sim.release("1.0", [a[1.0]])], Outcome.ROLLED_BACK) == once
    shadow3 = [sim.release("3.0", [a[3.0]], mode="shadow"), sim.release("1.0", [a[1.0]])]
    assert cycle(shadow3, Outcome.UP_TO_DATE) == once         # a new candidate
    assert cycle([sim.release("1.0", [a[1.0]])], Outcome.UP_TO_DATE) == once  # dropped
    assert up.store.pointer("clf").candidate is None
