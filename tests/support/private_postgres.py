"""A PostgreSQL cluster of a test's own, in a temp dir on a free loopback port, that the test
may stop and start (the machine's shared server must never be stopped: other tests use it).

initdb refuses to run as root, so as root the cluster belongs to the `postgres` user (the
package's own) and every pg_ctl call runs under `runuser`. `private_postgres()` skips — or
fails under MODELFLEET_REQUIRE_POSTGRES=1, as CI sets it — when the binaries or that user
are missing.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.served import free_port

PG_BIN = Path(os.environ.get("MODELFLEET_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))


@dataclass
class PrivatePostgres:
    data_dir: Path
    port: int
    user: str | None  # run pg_ctl as this user (None: as ourselves)
    log: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the cluster's `postgres` database (trust auth, loopback)."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres?connect_timeout=3"

    def _run(self, *args: str) -> None:
        cmd = [str(PG_BIN / args[0]), *args[1:]]
        if self.user is not None:
            cmd = ["runuser", "-u", self.user, "--", *cmd]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(args[:2])} failed: {done.stderr or done.stdout}"
                                 f"\n{self.log.read_text()[-2000:] if self.log.exists() else ''}")

    def start(self) -> None:
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log), "-w", "-t", "30",
                  "-o", f"-p {self.port} -k {self.data_dir} -c listen_addresses=127.0.0.1 "
                  "-c fsync=off -c max_connections=40", "start")

    def stop(self, mode: str = "fast") -> None:
        """`fast`: PostgreSQL ends every session (what a restart does); `immediate`: as a
        crash, no shutdown checkpoint."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-m", mode, "-w", "stop")


def _skip(reason: str) -> None:
    if os.environ.get("MODELFLEET_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"a private PostgreSQL cluster is required but {reason}")
    pytest.skip(reason)


@contextlib.contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private cluster, stopped and removed on exit."""
    if not (PG_BIN / "initdb").exists():
        _skip(f"no PostgreSQL binaries at {PG_BIN} (set MODELFLEET_TEST_PG_BIN)")
    user: str | None = None
    if os.geteuid() == 0:  # initdb refuses root
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError:
            _skip("running as root and there is no `postgres` user to own the cluster")
        if shutil.which("runuser") is None:
            _skip("running as root and `runuser` is missing")
        user = "postgres"
    root = Path(tempfile.mkdtemp(prefix="mf-pg-"))
    data = root / "data"
    if user is not None:
        os.chown(root, owner.pw_uid, owner.pw_gid)
    pg = PrivatePostgres(data, free_port(), user, root / "postgres.log")
    try:
        pg._run("initdb", "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                "--no-sync")
        pg.start()
        yield pg
    finally:
        with contextlib.suppress(AssertionError, subprocess.SubprocessError, OSError):
            pg.stop("immediate")
        shutil.rmtree(root, ignore_errors=True)
