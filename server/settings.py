"""Server settings, read from the environment (prefix `MODELFLEET_`) by pydantic-settings —
the only reader of the environment in the server (tests/test_layers.py checks).

The embedded default needs nothing but a data directory: SQLite file and blob directory live
under it. Outside `env=development` the settings refuse missing or placeholder secrets, so a
production deployment cannot start with `changethis` credentials by accident.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# Values that mean "nobody set this yet" — never acceptable for a secret in production.
PLACEHOLDER_SECRETS = frozenset(
    {"", "changethis", "changeme", "change-me", "secret", "password", "testing", "minioadmin"}
)

MiB = 1024 * 1024
MIN_PEPPER_LENGTH = 16


class SettingsError(ValueError):
    """Settings that cannot run: names the variable and what to set it to."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MODELFLEET_", extra="ignore")

    env: Literal["development", "production"] = "development"
    data_dir: Path = Path("data")
    # Empty = SQLite file `modelfleet.db` under data_dir (the embedded default).
    database_url: str = ""
    blob_store: Literal["local", "s3"] = "local"
    # Empty = `blobs/` under data_dir.
    blob_dir: Path | None = None

    s3_bucket: str = ""
    s3_endpoint_url: str = ""  # empty = AWS default endpoint for the region
    s3_region: str = "us-east-1"
    s3_access_key_id: str = ""  # empty = boto3's default credential chain
    s3_secret_access_key: str = ""
    s3_prefix: str = ""  # every key is stored under this prefix (e.g. "modelfleet/")
    # A refused connection, a timeout or a 5xx/throttle from S3 is retried by botocore
    # ("standard" mode: exponential backoff with jitter) up to this many attempts in all,
    # then the request fails with 503 storage_unavailable and nothing is published.
    s3_max_attempts: int = Field(default=5, ge=1, le=20)
    s3_connect_timeout_seconds: float = Field(default=10.0, gt=0)
    s3_read_timeout_seconds: float = Field(default=120.0, gt=0)

    # Secret mixed into every stored API token hash (HMAC-SHA256), so a copy of the database
    # alone cannot be used to test guessed tokens. Changing it invalidates every token.
    token_pepper: str = ""

    # Base URL devices use to reach artifacts and manifests (API origin, bucket or CDN).
    public_base_url: str = "http://127.0.0.1:8000"
    job_backend: Literal["inprocess", "procrastinate"] = "inprocess"
    # Signed manifests expire after this long; the server re-signs at half-life (issue 5: 24 h).
    manifest_lifetime_seconds: int = Field(default=24 * 3600, gt=0)
    # Where the release key (and, on the offline machine, the root keys) live; default
    # DATA_DIR/keys. In production mount only release.key here (root keys stay offline).
    keys_dir: Path | None = None

    # Manifest polls and telemetry (device traffic) are counted in /metrics; their answers
    # below 400 are written to the access log only with this on (server/api/observe.py;
    # `modelfleet serve --log-polls`).
    log_polls: bool = False
    # The HTTP server's limits (server/http_server.py): a request head (request line and
    # headers) larger than this is a 431 and the connection closed; a head not complete
    # this long after the connection (or the previous answer) is closed unanswered.
    max_header_bytes: int = Field(default=64 * 1024, ge=8192)
    header_read_timeout_seconds: float = Field(default=10.0, gt=0)
    # Log lines as human text or one JSON object per line (server/observability/logs.py);
    # `modelfleet serve|worker --log-format` overrides it. Text by default: a terminal or a
    # `tee` in development stays readable; deployments choose json (docker-compose.yml does).
    log_format: Literal["text", "json"] = "text"
    # Empty: GET /metrics answers without a token (scrapers inside the network). Set: it wants
    # `Authorization: Bearer <this>`.
    metrics_token: str = ""

    # Size caps for uploads (bytes). An .npz is also capped by the bytes its arrays take once
    # decompressed (read from the .npy headers at upload, before anything is inflated).
    max_model_bytes: int = Field(default=4096 * MiB, gt=0)
    max_npz_bytes: int = Field(default=512 * MiB, gt=0)
    max_npz_unpacked_bytes: int = Field(default=1024 * MiB, gt=0)

    # Compile sandbox (server/compile/sandbox.py, docs/security.md): every uploaded model is
    # opened only in a bubblewrap child with these limits. "off" (development only, refused
    # in production) compiles inside the server process, with access to its keys.
    sandbox: Literal["on", "off"] = "on"
    sandbox_memory_mb: int = Field(default=16 * 1024, gt=0)
    sandbox_timeout_seconds: int = Field(default=3300, gt=0)
    # The python of a separate venv with `aimet-onnx` (it pins its own torch/onnxruntime),
    # for the qnn quantizers aimet / aimet-adaround / aimet-seqmse; the compile sandbox binds
    # that venv read-only. Empty: those quantizers report "not installed".
    aimet_python: str = ""
    max_metadata_bytes: int = Field(default=64 * 1024, gt=0)
    # Every other request body (JSON); read into memory, so it stays small.
    max_json_body_bytes: int = Field(default=1 * MiB, gt=0)
    # Uploads streamed at once per server process; one more is a 503 with Retry-After.
    max_concurrent_uploads: int = Field(default=4, gt=0)

    # Device telemetry (POST /v1/telemetry, docs/shadow.md): body cap, accepted clock skew
    # of a batch's sent_at, per-device rate limit (requests/s and burst).
    max_telemetry_body_bytes: int = Field(default=256 * 1024, gt=0)
    telemetry_max_skew_seconds: int = Field(default=600, gt=0)
    telemetry_rate_per_second: float = Field(default=10.0, gt=0)
    telemetry_burst: int = Field(default=20, gt=0)
    # PostgreSQL: concurrent telemetry requests of a process share one transaction (each still
    # answers only after its rows are committed); off: one transaction per request.
    telemetry_group_commit: bool = True
    # POSTed a JSON event when the guard halts a rollout by itself; empty = no webhook.
    halt_webhook_url: str = ""
    # How often an API process looks for rollouts whose next ramp step is due.
    ramp_check_seconds: float = Field(default=15.0, gt=0)
    # Uploaded files no version names (an upload killed before its commit) are deleted once
    # older than the grace period, which must exceed the longest upload; each API process
    # looks at start and every interval after (0: never, only `modelfleet gc`).
    source_gc_grace_seconds: float = Field(default=24 * 3600, ge=0)
    source_gc_interval_seconds: float = Field(default=3600.0, ge=0)
    # Tests only: SIGKILL this process group at a named step (server/crashpoints.py STEPS,
    # `step` or `step@n`); refused outside development.
    crash_at: str = ""

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.data_dir / 'modelfleet.db').resolve()}"

    @property
    def resolved_blob_dir(self) -> Path:
        return self.blob_dir if self.blob_dir is not None else self.data_dir / "blobs"

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.aimet_python and not Path(self.aimet_python).is_absolute():
            raise SettingsError(
                f"MODELFLEET_AIMET_PYTHON is {self.aimet_python!r}: give the absolute path of "
                "the AIMET venv's python (e.g. /opt/aimet-venv/bin/python)"
            )
        if self.blob_store == "s3" and not self.s3_bucket:
            raise SettingsError(
                "MODELFLEET_S3_BUCKET is empty but MODELFLEET_BLOB_STORE=s3: set the bucket name"
            )
        if self.env == "development":
            return self
        if self.crash_at:
            raise SettingsError(
                "MODELFLEET_CRASH_AT is set while MODELFLEET_ENV=production: it makes the "
                "server kill itself at a named step (for the crash tests); unset it"
            )
        if self.sandbox == "off":
            raise SettingsError(
                "MODELFLEET_SANDBOX=off while MODELFLEET_ENV=production: uploaded models would "
                "be opened inside the server with access to its keys and database; install "
                "bubblewrap and remove MODELFLEET_SANDBOX (docs/security.md)"
            )
        if self.blob_store == "s3" and self.s3_access_key_id:
            if self.s3_secret_access_key.strip().lower() in PLACEHOLDER_SECRETS:
                raise SettingsError(
                    "MODELFLEET_S3_SECRET_ACCESS_KEY is missing or a placeholder while "
                    "MODELFLEET_ENV=production: set the real secret key (or leave "
                    "MODELFLEET_S3_ACCESS_KEY_ID empty to use boto3's credential chain)"
                )
        pepper = self.token_pepper.strip()
        if pepper.lower() in PLACEHOLDER_SECRETS or len(pepper) < MIN_PEPPER_LENGTH:
            raise SettingsError(
                "MODELFLEET_TOKEN_PEPPER is missing, a placeholder or shorter than "
                f"{MIN_PEPPER_LENGTH} characters while MODELFLEET_ENV=production: set it to a "
                "long random string, e.g. `python -c 'import secrets; "
                "print(secrets.token_urlsafe(32))'`"
            )
        password = _url_password(self.database_url)
        if password is not None and password.lower() in PLACEHOLDER_SECRETS:
            raise SettingsError(
                "MODELFLEET_DATABASE_URL carries a placeholder password while "
                "MODELFLEET_ENV=production: set the real database password"
            )
        return self


def _url_password(url: str) -> str | None:
    if not url or "://" not in url:
        return None
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).password
    except Exception:  # a malformed URL fails later, at connect, with its own message
        return None
