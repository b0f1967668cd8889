"""The ``root`` document: the offline root keys and the keys allowed to sign manifests.

JSON (payloadType ``application/vnd.modelfleet.root+json``)::

    {"type": "root", "version": 1, "expires": 1893456000,
     "keys": {"<keyid>": {"keytype": "ed25519", "public": "<64 hex>"}},
     "roles": {"root": {"keyids": ["<keyid>"], "threshold": 1},
               "release": {"keyids": ["<keyid>"], "threshold": 1}}}
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from typing import ClassVar

from . import strictjson
from ._fields import Fields, is_sha256, merge_extra, string_item
from .errors import MalformedError, WrongTypeError
from .keys import key_id
from .strictjson import JSONObject, JSONValue

ROOT_ROLE = "root"
RELEASE_ROLE = "release"
MAX_KEYS = 64


@dataclass(frozen=True)
class PublicKey:
    """A public key entry. ``public_hex`` is lowercase hex of the raw 32-byte Ed25519 key."""

    keytype: str
    public_hex: str
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def ed25519(cls, public_key: bytes) -> PublicKey:
        key_id(public_key)  # validates the length
        return cls("ed25519", public_key.hex())

    @property
    def public_bytes(self) -> bytes:
        return bytes.fromhex(self.public_hex)

    @property
    def keyid(self) -> str:
        return key_id(self.public_bytes)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "key") -> PublicKey:
        f = Fields(value, path)
        keytype = f.literal("keytype", ("ed25519",))
        public = f.string("public")
        if len(public) != 64 or not all(c in "0123456789abcdef" for c in public):
            raise f.fail("public", "must be 64 lowercase hex digits (a raw Ed25519 public key)")
        return cls(keytype, public, f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({"keytype": self.keytype, "public": self.public_hex}, self.extra)


@dataclass(frozen=True)
class Role:
    """Key ids allowed to sign for a role and how many distinct ones must."""

    keyids: list[str]
    threshold: int
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "role") -> Role:
        f = Fields(value, path)
        keyids = f.array("keyids", string_item, max_items=MAX_KEYS)
        if len(set(keyids)) != len(keyids):
            raise f.fail("keyids", "lists a key id twice")
        if not keyids:
            raise f.fail("keyids", "must not be empty")
        threshold = f.integer("threshold", minimum=1, maximum=len(keyids))
        return cls(keyids, threshold, f.extra())

    def to_dict(self) -> JSONObject:
        keyids: list[JSONValue] = list(self.keyids)
        return merge_extra({"keyids": keyids, "threshold": self.threshold}, self.extra)


@dataclass(frozen=True)
class Root:
    """The trust anchor. ``raw_sha256`` is set on documents that came out of verification."""

    version: int
    expires: int
    keys: dict[str, PublicKey]
    roles: dict[str, Role]
    extra: JSONObject = field(default_factory=dict)
    raw_sha256: str | None = field(default=None, compare=False)

    TYPE: ClassVar[str] = "root"

    def role_keys(self, role: str) -> dict[str, bytes]:
        """Key id -> raw public key for the keys of ``role`` (``"root"`` or ``"release"``)."""
        return {kid: self.keys[kid].public_bytes for kid in self.roles[role].keyids}

    def is_expired(self, now: int) -> bool:
        return now >= self.expires

    @classmethod
    def from_dict(cls, value: JSONValue) -> Root:
        f = Fields(value, "root")
        doc_type = f.string("type", max_len=1 << 30, allow_empty=True)  # other: WrongType
        if doc_type != cls.TYPE:
            raise WrongTypeError(f"document type is {doc_type[:40]!r}, expected 'root'")
        version = f.integer("version", minimum=1)
        expires = f.integer("expires")
        keys = f.mapping("keys", PublicKey.from_dict, key_check=is_sha256,
                         key_rule="a key id (64 lowercase hex)", max_items=MAX_KEYS)
        for kid, key in keys.items():
            if key.keyid != kid:
                raise MalformedError(f"root.keys[{kid!r}]: key id is not sha256 of the public key")
        roles = f.mapping("roles", Role.from_dict)
        for required in (ROOT_ROLE, RELEASE_ROLE):
            if required not in roles:
                raise MalformedError(f"root.roles.{required} is required")
        for name, role in roles.items():
            for kid in role.keyids:
                if kid not in keys:
                    raise MalformedError(
                        f"root.roles.{name} names key {kid[:16]}… that is not in root.keys"
                    )
        return cls(version, expires, keys, roles, f.extra())

    @classmethod
    def from_bytes(cls, data: bytes) -> Root:
        """Parse (not verify) root JSON bytes; sets ``raw_sha256``."""
        root = cls.from_dict(strictjson.loads(data, what="root"))
        return replace(root, raw_sha256=hashlib.sha256(data).hexdigest())

    def to_dict(self) -> JSONObject:
        known: JSONObject = {
            "type": self.TYPE,
            "version": self.version,
            "expires": self.expires,
            "keys": {k: v.to_dict() for k, v in self.keys.items()},
            "roles": {k: v.to_dict() for k, v in self.roles.items()},
        }
        return merge_extra(known, self.extra)

    def to_bytes(self) -> bytes:
        """Serialized for signing; refuses (MalformedError) a document no verifier would accept."""
        data = strictjson.dumps(self.to_dict())
        Root.from_bytes(data)
        return data
