"""A second, independent implementation written from docs/manifest.md alone (stdlib + pynacl,
no `manifests` imports) must agree with every envelope, bucketing and version-range vector.
This is the check that the spec and vectors are enough for another language."""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import nacl.exceptions
import nacl.signing
import pytest

VECTORS = Path(__file__).resolve().parents[2] / "manifests" / "vectors"


class Refused(Exception):
    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self.kind = kind


def _b64(text: Any) -> bytes:  # spec 4.1: standard, padded, canonical
    if not isinstance(text, str) or not re.fullmatch(r"(?:[A-Za-z0-9+/]{4})*"
                                                     r"(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?",
                                                     text):
        raise Refused("MalformedError")
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as e:
        raise Refused("MalformedError") from e
    if base64.b64encode(raw).decode() != text:
        raise Refused("MalformedError")
    return raw


def _pae(payload_type: str, body: bytes) -> bytes:  # spec 4.2
    t = payload_type.encode()
    return b" ".join([b"DSSEv1", str(len(t)).encode(), t, str(len(body)).encode(), body])


def spec_verify(envelope: dict[str, Any], keys: dict[str, bytes], threshold: int,
                expected_type: str) -> bytes:
    ptype, payload, sigs = (envelope.get(k) for k in ("payloadType", "payload", "signatures"))
    if not isinstance(ptype, str) or not isinstance(sigs, list):
        raise Refused("MalformedError")
    body = _b64(payload)
    parsed = []
    for s in sigs:
        if not isinstance(s, dict) or not isinstance(s.get("keyid"), str):
            raise Refused("MalformedError")
        parsed.append((s["keyid"], _b64(s.get("sig"))))
    if ptype != expected_type:
        raise Refused("WrongTypeError")
    message, good = _pae(ptype, body), set()
    for keyid, sig in parsed:  # spec 4.3
        if keyid in good or keyid not in keys or len(sig) != 64:
            continue
        try:
            nacl.signing.VerifyKey(keys[keyid]).verify(message, sig)
            good.add(keyid)
        except nacl.exceptions.BadSignatureError:
            pass
    if len(good) < threshold:
        raise Refused("SignatureError")
    return body


@pytest.mark.parametrize("v", json.loads((VECTORS / "envelopes.json").read_text()),
                         ids=lambda v: v["name"])
def test_independent_verifier_agrees_with_envelope_vector(v: dict[str, Any]) -> None:
    keys = {}
    for kid, public_hex in v["public_keys"].items():
        public = bytes.fromhex(public_hex)
        assert hashlib.sha256(public).hexdigest() == kid  # spec 3
        keys[kid] = public
    try:
        spec_verify(v["envelope"], keys, v["threshold"], v["payload_type"])
        outcome = None
    except Refused as e:
        outcome = e.kind
    assert outcome == v["error"]


def test_independent_bucketing_agrees_with_every_vector() -> None:
    for v in json.loads((VECTORS / "bucketing.json").read_text()):
        digest = hashlib.sha256(f"{v['salt']}:{v['device_id']}".encode()).digest()  # spec 9.2
        b = int.from_bytes(digest[:8], "big") % 1_000_000
        assert (b, b < v["share_ppm"]) == (v["bucket"], v["included"])


_NUM = r"[0-9]{1,9}"
_VER = rf"{_NUM}(?:\.{_NUM}){{0,7}}"


def _spec_contains(text: str, version: str) -> bool | None:  # spec 10; None = invalid range
    clauses = []
    for piece in text.split(","):
        m = re.fullmatch(rf" *(>=|<=|==|!=|>|<) *({_VER}) *", piece)
        if not m:
            return None
        clauses.append((m.group(1), [int(x) for x in m.group(2).split(".")]))
    if not re.fullmatch(_VER, version):
        return False
    v = [int(x) for x in version.split(".")]
    for op, bound in clauses:
        n = max(len(v), len(bound))
        a, b = v + [0] * (n - len(v)), bound + [0] * (n - len(bound))
        ok = {">=": a >= b, "<=": a <= b, ">": a > b, "<": a < b, "==": a == b, "!=": a != b}[op]
        if not ok:
            return False
    return True


def test_independent_version_ranges_agree_with_every_vector() -> None:
    for v in json.loads((VECTORS / "version_ranges.json").read_text()):
        got = _spec_contains(v["range"], v["version"])
        if not v["valid_range"]:
            assert got is None, v
        else:
            assert got is v["matches"], v
