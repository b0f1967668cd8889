"""Every manifest signature goes through the publisher's `Signer` (issue 9): a signer that is
not a key file (an HSM/KMS stand-in holding the key in memory) publishes verifiable
manifests, and the local key file signer re-reads the file, so a rotated key signs next."""

from __future__ import annotations

from dataclasses import replace

import manifests
from server.publish.keyfile import key_file_bytes, load_release_key, write_atomic
from server.publish.signer import KeySigner, LocalKeySigner, Signer
from server.rollouts import channels
from tests.publish.test_publisher import ACTOR, current


class RecordingSigner(KeySigner):
    """A real in-memory signer that also keeps what it was asked to sign."""

    def __init__(self, key: manifests.SigningKey) -> None:
        super().__init__(key)
        self.messages: list[bytes] = []

    def sign(self, message: bytes) -> bytes:
        self.messages.append(message)
        return super().sign(message)


def test_a_signer_without_a_key_file_publishes_verifiable_manifests(
        factory, pub, blob_store, root, key_paths) -> None:
    signer = RecordingSigner(load_release_key(key_paths.release_key_path))
    key_paths.release_key_path.unlink()  # the key now lives only "in the HSM"
    assert isinstance(signer, Signer)
    channels.create_channel(factory, replace(pub, signer=signer), "prod", actor=ACTOR)
    m, data = current(factory, blob_store, root)
    assert m.serial == 1
    env = manifests.Envelope.from_bytes(data, 1 << 20)
    assert signer.messages == [manifests.pae(env.payload_type, env.payload)]


def test_local_key_signer_reads_the_key_file_at_each_use(key_paths) -> None:
    signer = LocalKeySigner(key_paths.release_key_path)
    before = signer.keyid()
    rotated = manifests.SigningKey.generate()
    write_atomic(key_paths.release_key_path, key_file_bytes("release", rotated), 0o600)
    assert signer.keyid() == rotated.keyid != before
