"""Settings: the embedded default needs nothing; production refuses placeholder secrets."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from server.settings import Settings

PEPPER = "a-long-random-pepper-value-0123456789"


def test_embedded_default_is_sqlite_and_local_blobs_under_data_dir(tmp_path: Path) -> None:
    s = Settings(data_dir=tmp_path)
    assert s.resolved_database_url == f"sqlite:///{(tmp_path / 'modelfleet.db').resolve()}"
    assert s.resolved_blob_dir == tmp_path / "blobs"
    assert (s.env, s.blob_store, s.job_backend) == ("development", "local", "inprocess")


def test_settings_come_from_prefixed_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MODELFLEET_ENV", "production")
    monkeypatch.setenv("MODELFLEET_DATABASE_URL", "postgresql://mf:s3cr3t-value@db/mf")
    monkeypatch.setenv("MODELFLEET_MANIFEST_LIFETIME_SECONDS", "3600")
    monkeypatch.setenv("MODELFLEET_TOKEN_PEPPER", PEPPER)
    s = Settings()
    assert (s.env, s.manifest_lifetime_seconds) == ("production", 3600)
    assert s.resolved_database_url == "postgresql://mf:s3cr3t-value@db/mf"


@pytest.mark.parametrize("secret", ["", "changethis", "minioadmin", "CHANGEME"])
def test_production_refuses_placeholder_s3_secret(secret: str) -> None:
    with pytest.raises(ValidationError, match="MODELFLEET_S3_SECRET_ACCESS_KEY"):
        Settings(env="production", blob_store="s3", s3_bucket="b", s3_access_key_id="AKIA",
                 s3_secret_access_key=secret, token_pepper=PEPPER)


def test_production_refuses_placeholder_database_password() -> None:
    with pytest.raises(ValidationError, match="MODELFLEET_DATABASE_URL"):
        Settings(env="production", database_url="postgresql://mf:changethis@db/mf",
                 token_pepper=PEPPER)


@pytest.mark.parametrize("pepper", ["", "changethis", "short-pepper"])
def test_production_refuses_missing_placeholder_or_short_token_pepper(pepper: str) -> None:
    with pytest.raises(ValidationError, match="MODELFLEET_TOKEN_PEPPER"):
        Settings(env="production", token_pepper=pepper)


def test_development_tolerates_placeholders() -> None:
    s = Settings(env="development", blob_store="s3", s3_bucket="b", s3_access_key_id="x",
                 s3_secret_access_key="changethis", database_url="postgresql://u:changethis@h/d")
    assert (s.s3_secret_access_key, s.token_pepper) == ("changethis", "")


def test_production_with_real_secrets_is_accepted() -> None:
    s = Settings(env="production", blob_store="s3", s3_bucket="b", s3_access_key_id="AKIA",
                 s3_secret_access_key="wJalrXUtnFEMI-real",
                 database_url="postgresql://u:Xy7-real@h/d", token_pepper=PEPPER)
    assert s.blob_store == "s3"


def test_docker_compose_variable_names_are_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # docker-compose.yml sets these; a renamed field would be silently ignored.
    for name, value in {"MODELFLEET_S3_ACCESS_KEY_ID": "AKIA",
                        "MODELFLEET_S3_SECRET_ACCESS_KEY": "real-secret-value",
                        "MODELFLEET_TOKEN_PEPPER": PEPPER, "MODELFLEET_BLOB_STORE": "s3",
                        "MODELFLEET_S3_BUCKET": "modelfleet", "MODELFLEET_ENV": "production",
                        "MODELFLEET_S3_ENDPOINT_URL": "http://minio:9000"}.items():
        monkeypatch.setenv(name, value)
    s = Settings()
    assert (s.s3_access_key_id, s.s3_secret_access_key, s.token_pepper, s.s3_endpoint_url) == (
        "AKIA", "real-secret-value", PEPPER, "http://minio:9000")


def test_s3_store_needs_a_bucket() -> None:
    with pytest.raises(ValidationError, match="MODELFLEET_S3_BUCKET"):
        Settings(blob_store="s3")


def test_the_aimet_interpreter_reaches_the_sandbox_policy(monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path) -> None:
    from server.compile.sandbox import SandboxPolicy

    monkeypatch.setenv("MODELFLEET_AIMET_PYTHON", "/opt/aimet-venv/bin/python")
    policy = SandboxPolicy.from_settings(Settings(data_dir=tmp_path))
    assert policy.aimet_python == "/opt/aimet-venv/bin/python"
    assert SandboxPolicy.from_settings(Settings(data_dir=tmp_path, aimet_python="")
                                       ).aimet_python == ""


def test_a_relative_aimet_interpreter_is_refused() -> None:
    with pytest.raises(ValidationError, match=r"MODELFLEET_AIMET_PYTHON.*absolute"):
        Settings(aimet_python="aimet-venv/bin/python")
