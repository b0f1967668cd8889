"""Debian's nginx in tests: started on a free loopback port with a configuration from
server/publish/nginxconf.py, stopped at the end. Tests that need it skip when nginx is not
installed (scripts/setup installs it with the dev extra), unless CI demands it."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support.served import free_port

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


def require_nginx() -> str:
    if NGINX is None:
        if os.environ.get("MODELFLEET_REQUIRE_POSTGRES") == "1" or os.environ.get("CI") == "true":
            pytest.fail("nginx is missing (CI needs it: apt-get install nginx, or "
                        "scripts/setup with the dev extra as root)")
        pytest.skip("nginx is not installed (apt-get install nginx)")
    return NGINX


@contextmanager
def running_nginx(work: Path, server: Callable[[str], str]) -> Iterator[str]:
    """nginx serving `server(listen)` (an http-context body); yields its base URL."""
    from server.publish import nginxconf

    binary = require_nginx()
    (work / "tmp").mkdir(parents=True, exist_ok=True)
    port = free_port()
    conf = work / "nginx.conf"
    # Started as root, nginx's workers would run as nobody, who cannot read pytest's tmp dirs.
    user = "root" if os.geteuid() == 0 else None
    conf.write_text(nginxconf.standalone(server(f"127.0.0.1:{port}"), work, user=user,
                                         access_log=True))
    proc = subprocess.Popen([binary, "-c", str(conf), "-e", str(work / "error.log"),
                             "-g", "daemon off;"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"nginx exited: {proc.stderr.read().decode()[-2000:]}"
                                     if proc.stderr else "nginx exited")
            try:
                urllib.request.urlopen(base + "/", timeout=1)
            except urllib.error.HTTPError:
                break  # 404 for / : it answers
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("nginx did not come up") from None
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)
