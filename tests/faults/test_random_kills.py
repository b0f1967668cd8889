"""Random kills: 50 server lives, 30 on SQLite and 20 on PostgreSQL with S3 over HTTP, each
armed at a random crash point (a random hit of it, for the steps a release passes several
times; seeded, so a failure replays), each first finishing what the previous life left —
the invariants must hold after every restart (tests/support/invariants.py) — then driving
on into the next release cycle; the last life drives everything to the end. Rigs of ten
lives each, so the state (and a life's cost) stays small."""

from __future__ import annotations

import contextlib
import random
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import postgres_database
from tests.faults.harness import SERVE_STEPS, ForkServer, finish, life, rig

RUNS = {"sqlite": 30, "postgresql": 20}
LIVES_PER_RIG = 10


def armed_at(rng: random.Random) -> str:
    step = rng.choice(SERVE_STEPS)
    return f"{step}@{rng.randint(1, 3) if step.startswith('publish.') else 1}"


@pytest.mark.slow
def test_random_kills_leave_every_invariant_holding(
        backend: tuple[str, Any], forker: ForkServer, tmp_path: Path) -> None:
    url, s3 = backend
    runs = RUNS["sqlite" if s3 is None else "postgresql"]
    rng = random.Random(f"random-kills-{runs}")
    crashed = []
    for k in range(runs // LIVES_PER_RIG):
        with contextlib.ExitStack() as stack:
            if s3 is None:
                db_url = f"sqlite:///{tmp_path / f'rig{k}.db'}"
            else:
                db_url = url if k == 0 else stack.enter_context(postgres_database())
            r = stack.enter_context(rig(tmp_path / f"rig{k}", db_url, s3, forker,
                                        s3_prefix=f"rig{k}/"))
            for _ in range(LIVES_PER_RIG):
                step = armed_at(rng)
                if life(r, step):
                    crashed.append(step)
            finish(r)
    # Nearly every life dies where it was armed (a life that reaches the end of its drive
    # first is stopped instead); the spread covers most steps.
    assert len(crashed) >= runs * 0.7, crashed
    assert len({c.split("@")[0] for c in crashed}) >= len(SERVE_STEPS) - 2, crashed
