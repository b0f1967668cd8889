"""The shared fixtures work: a real database round trip and a real S3 round trip over HTTP."""

import sqlalchemy as sa


def test_database_url_round_trip(database_url: str) -> None:
    engine = sa.create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(sa.text("CREATE TABLE t (x INTEGER)"))
        conn.execute(sa.text("INSERT INTO t VALUES (42)"))
        assert conn.execute(sa.text("SELECT x FROM t")).scalar_one() == 42
    engine.dispose()


def test_s3_bucket_round_trip_over_http(s3_bucket) -> None:
    assert s3_bucket.endpoint_url.startswith("http://127.0.0.1:")
    client = s3_bucket.client()
    client.put_object(Bucket=s3_bucket.bucket, Key="k", Body=b"hello")
    assert client.get_object(Bucket=s3_bucket.bucket, Key="k")["Body"].read() == b"hello"


def test_no_test_module_imports_from_conftest() -> None:
    """Several folders have a conftest.py; `from conftest import …` binds to whichever one
    pytest imported first, so it passes alone and fails in the full run. Share helpers through
    uniquely named modules instead."""
    import re
    from pathlib import Path

    pattern = re.compile(r"^\s*(from conftest import|import conftest)", re.M)
    tests = Path(__file__).parent
    offenders = [str(p.relative_to(tests)) for p in tests.rglob("*.py")
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []
