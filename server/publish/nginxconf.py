"""nginx configurations that serve the bucket's read paths to devices (server/publish/bucket.py),
rendered from the same table the publisher writes with, so their headers cannot drift from
the API's:

- `directory_server`: nginx serving a local blob directory (LocalBlobStore's `objects/`) as
  the read API. Only the four read paths (sources/ and manifests/ stay private), each with the
  API's Content-Type and Cache-Control; nginx's own ETag (mtime and length, changed by every
  put: server/blobstore/local.py) answers If-None-Match with 304, Range with 206.
- `caching_proxy`: the device-facing cache in front of the bucket (docker-compose's
  `device-cache`). A manifest is fresh for `manifest_fresh_seconds`, then revalidated
  upstream with If-None-Match (one request per channel at a time, the others served the
  cached copy meanwhile), so the bucket sees about one conditional request per channel per
  interval whatever the fleet size, and a halt reaches devices within that interval plus
  their poll interval. Roots, artifacts and patches are cached as long as their immutable
  header says (their URL names their content). A missing key is a 404 as from the API, also
  where S3 says 403 (a bucket policy without s3:ListBucket); misses are cached for the same
  short interval (every poll asks for root N+1 first).
- `standalone`: a whole nginx.conf around either server, runnable without root (own pid, logs
  and temp paths): what the tests and bench/serve start.

`modelfleet bucket nginx` prints them; deploy/nginx/device-cache.conf is `caching_proxy`'s
output for docker-compose (tests/test_compose.py keeps it equal).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path

from server.publish.bucket import MANIFEST, READ_PATHS, ReadPath

MANIFEST_FRESH_SECONDS = 1
CACHE_ZONE = "devices"


def _location(path: ReadPath, body: str) -> str:
    return f'    location ~ "^/{path.pattern}$" {{\n{body}    }}\n'


def directory_server(objects_dir: Path | str, listen: str) -> str:
    """A `server { }` block serving `objects_dir` (a local store's objects/) to devices."""
    locations = "".join(_location(p, (
        f"        types {{ }}\n        default_type {p.content_type};\n"
        f'        add_header Cache-Control "{p.cache_control}";\n'
        "        try_files $uri =404;\n")) for p in READ_PATHS)
    return (f"server {{\n    listen {listen};\n    root {objects_dir};\n"
            "    etag on;\n    server_tokens off;\n"
            "    location / { return 404; }\n" + locations + "}\n")


def caching_proxy(upstream: str, listen: str, cache_dir: Path | str, *,
                  manifest_fresh_seconds: int = MANIFEST_FRESH_SECONDS,
                  max_size: str = "10g") -> str:
    """`proxy_cache_path`, an `upstream` and a `server { }` (for nginx's http context) caching
    the read paths of the bucket at `upstream` (e.g. http://minio:9000/modelfleet: the
    endpoint, then the bucket and any key prefix as the path)."""
    parts = urllib.parse.urlsplit(upstream)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"upstream {upstream!r} must be an http(s) URL of the bucket, e.g. "
                         "http://minio:9000/modelfleet")
    prefix = parts.path.rstrip("/")
    fresh = f"{manifest_fresh_seconds}s"
    tls = ("        proxy_ssl_server_name on;\n"
           f"        proxy_ssl_name {parts.hostname};\n") if parts.scheme == "https" else ""
    common = (
        f"        rewrite ^ {prefix}$uri break;\n"
        f"        proxy_pass {parts.scheme}://bucket;\n"
        f"        proxy_set_header Host {parts.netloc};\n"
        '        proxy_set_header Connection "";\n'  # keep upstream connections alive
        f"{tls}"
        f"        proxy_cache {CACHE_ZONE};\n"
        "        proxy_cache_key $uri;\n"
        "        proxy_cache_lock on;\n"
        "        proxy_cache_use_stale updating error timeout http_500 http_502 http_503"
        " http_504;\n"
        f"        proxy_cache_valid 403 404 {fresh};\n"
        "        proxy_intercept_errors on;\n"
        "        error_page 403 404 =404 @missing;\n"
        "        add_header X-Cache-Status $upstream_cache_status;\n")

    def body(path: ReadPath) -> str:
        if path is not MANIFEST:  # immutable: the bucket's own Cache-Control says a year
            return common
        # Revalidate by ETag alone: Last-Modified has whole seconds, and two manifests
        # published within one would pass If-Modified-Since on a store that checks it first
        # (moto does; RFC 9110 and S3 give If-None-Match precedence).
        return common + (
            "        proxy_ignore_headers Cache-Control Expires;\n"
            f"        proxy_cache_valid 200 {fresh};\n"
            "        proxy_cache_revalidate on;\n"
            '        proxy_set_header If-Modified-Since "";\n')

    return (
        f"proxy_cache_path {cache_dir} levels=1:2 keys_zone={CACHE_ZONE}:10m "
        f"max_size={max_size} inactive=30d use_temp_path=off;\n"
        f"upstream bucket {{\n    server {parts.hostname}:{parts.port or _port(parts)};\n"
        "    keepalive 16;\n}\n"
        f"server {{\n    listen {listen};\n    server_tokens off;\n"
        "    proxy_http_version 1.1;\n"
        "    location / { return 404; }\n"
        "    location @missing { return 404; }\n"
        + "".join(_location(p, body(p)) for p in READ_PATHS) + "}\n")


def _port(parts: urllib.parse.SplitResult) -> int:
    return 443 if parts.scheme == "https" else 80


def standalone(http_body: str, work_dir: Path, *, workers: int = 1, access_log: bool = False,
               user: str | None = None) -> str:
    """A complete nginx.conf for `nginx -c FILE -g 'daemon off;'` as any user, keeping its
    pid, error log and temp files under `work_dir` (its `tmp/` must exist). `user`: who the
    workers run as when started by root (nginx's default, nobody, may not read the files)."""
    tmp = work_dir / "tmp"
    temps = "".join(f"    {kind}_temp_path {tmp}/{kind};\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    log = f"access_log {work_dir}/access.log;" if access_log else "access_log off;"
    indented = "".join(f"    {line}\n" if line else "\n" for line in http_body.splitlines())
    return ((f"user {user};\n" if user else "") + f"worker_processes {workers};\n"
            f"pid {work_dir}/nginx.pid;\n"
            f"error_log {work_dir}/error.log;\nevents {{ worker_connections 4096; }}\n"
            f"http {{\n    {log}\n{temps}{indented}}}\n")
