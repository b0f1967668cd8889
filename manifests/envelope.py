"""DSSE v1 signing envelope: PAE, signing, strict parsing and threshold verification.

Wire form (JSON object)::

    {"payloadType": str, "payload": base64(bytes), "signatures": [{"keyid": str, "sig": base64}]}

Each signature is Ed25519 over ``pae(payloadType, payload)``. Verification returns the payload
bytes exactly as received, so no canonical-JSON rules are ever needed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from . import strictjson
from .errors import MalformedError, OversizeError, SignatureError, WrongTypeError
from .keys import SigningKey, verify_signature
from .strictjson import JSONObject, JSONValue

ROOT_PAYLOAD_TYPE = "application/vnd.modelfleet.root+json"
MANIFEST_PAYLOAD_TYPE = "application/vnd.modelfleet.manifest+json"

# More signatures than any sane role needs; bounds the verification work an attacker can cause.
MAX_SIGNATURES = 64


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE v1 Pre-Authentication Encoding, the bytes that are actually signed.

    ``b"DSSEv1 " + len(type) + b" " + type + b" " + len(payload) + b" " + payload`` with the
    lengths in bytes, written as ASCII decimal without leading zeros, type UTF-8 encoded.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str, what: str) -> bytes:
    """Standard base64 with padding, canonical only (re-encoding gives back the same text)."""
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise MalformedError(f"{what} is not standard padded base64") from e
    if _b64encode(data) != text:
        raise MalformedError(f"{what} is not canonical base64 (non-zero padding bits)")
    return data


@dataclass(frozen=True)
class Signature:
    """One DSSE signature: who (key id) and the 64 raw signature bytes."""

    keyid: str
    sig: bytes


@dataclass(frozen=True)
class Envelope:
    """A parsed (not yet verified) DSSE envelope."""

    payload_type: str
    payload: bytes
    signatures: tuple[Signature, ...] = field(default=())

    @classmethod
    def from_bytes(cls, data: bytes, max_size: int) -> Envelope:
        """Parse an envelope, refusing anything larger than ``max_size`` bytes.

        Raises:
            OversizeError: ``data`` is longer than ``max_size`` or holds more than
                ``MAX_SIGNATURES`` signatures.
            MalformedError: not strict JSON, or a field is missing, ill-typed or not base64.
        """
        if len(data) > max_size:
            raise OversizeError(f"envelope is {len(data)} bytes, over the cap of {max_size}")
        return cls.from_dict(strictjson.loads(data, what="envelope"))

    @classmethod
    def from_dict(cls, obj: JSONObject) -> Envelope:
        """Build an envelope from its parsed JSON object (see ``from_bytes``)."""
        payload_type = obj.get("payloadType")
        payload = obj.get("payload")
        signatures = obj.get("signatures")
        if not isinstance(payload_type, str):
            raise MalformedError("envelope field 'payloadType' must be a string")
        if not isinstance(payload, str):
            raise MalformedError("envelope field 'payload' must be a base64 string")
        if not isinstance(signatures, list):
            raise MalformedError("envelope field 'signatures' must be a list")
        if len(signatures) > MAX_SIGNATURES:
            raise OversizeError(
                f"envelope has {len(signatures)} signatures, over the cap of {MAX_SIGNATURES}"
            )
        parsed: list[Signature] = []
        for i, item in enumerate(signatures):
            if not isinstance(item, dict):
                raise MalformedError(f"envelope signatures[{i}] must be an object")
            keyid, sig = item.get("keyid"), item.get("sig")
            if not isinstance(keyid, str) or not isinstance(sig, str):
                raise MalformedError(f"envelope signatures[{i}] needs string 'keyid' and 'sig'")
            parsed.append(Signature(keyid, _b64decode(sig, f"signatures[{i}].sig")))
        return cls(payload_type, _b64decode(payload, "payload"), tuple(parsed))

    def to_dict(self) -> JSONObject:
        sigs: list[JSONValue] = [
            {"keyid": s.keyid, "sig": _b64encode(s.sig)} for s in self.signatures
        ]
        return {
            "payloadType": self.payload_type,
            "payload": _b64encode(self.payload),
            "signatures": sigs,
        }

    def to_bytes(self) -> bytes:
        return strictjson.dumps(self.to_dict())

    @property
    def payload_sha256(self) -> str:
        """Hex sha256 of the payload: the identity of the signed document."""
        return hashlib.sha256(self.payload).hexdigest()


def sign_envelope(payload: bytes, payload_type: str, keys: Sequence[SigningKey]) -> bytes:
    """Sign ``payload`` with every key and return the DSSE envelope as JSON bytes."""
    message = pae(payload_type, payload)
    sigs = tuple(Signature(k.keyid, k.sign(message)) for k in keys)
    return Envelope(payload_type, payload, sigs).to_bytes()


def verify_envelope(
    env: Envelope, public_keys: Mapping[str, bytes], threshold: int, payload_type: str
) -> bytes:
    """Check payloadType and that ``threshold`` distinct trusted keys signed; return the payload.

    ``public_keys`` maps key id -> raw 32-byte Ed25519 public key. Signatures by key ids not
    in it are ignored; several signatures carrying one key id count once; an invalid signature
    is ignored (it does not poison valid ones).

    Raises:
        WrongTypeError: ``env.payload_type`` differs from ``payload_type``.
        SignatureError: fewer than ``threshold`` distinct trusted keys produced a valid signature.
        ValueError: ``threshold`` < 1 (a caller bug: a zero threshold would trust anything).
    """
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, got {threshold}")
    if env.payload_type != payload_type:
        raise WrongTypeError(
            f"payloadType is {env.payload_type!r}, expected {payload_type!r}"
        )
    message = pae(env.payload_type, env.payload)
    good: set[str] = set()
    for s in env.signatures:
        if s.keyid in good or s.keyid not in public_keys:
            continue
        if verify_signature(public_keys[s.keyid], message, s.sig):
            good.add(s.keyid)
    if len(good) < threshold:
        raise SignatureError(
            f"{len(good)} valid signature(s) from trusted keys, threshold is {threshold}"
        )
    return env.payload
