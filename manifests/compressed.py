"""The manifest's ``compressed`` object: a smaller copy of an artifact to download instead.

An artifact's ``url``/``length``/``sha256`` stay what they always were (the content, or the
sealed content of a protected release), so an SDK that predates this field ignores it (it is
kept as an unknown field) and downloads the content as before. A newer SDK may download the
compressed copy instead; the manifest signs both sides of the decompression:

- ``length``/``sha256`` here: the downloaded bytes, checked before anything reads them;
- the artifact's content (its ``length``/``sha256``, or ``sealed.plain_*`` when protected):
  what decompression must produce. The decompressor stops at that length (a larger output
  is a decompression bomb, refused mid-stream) and the result is hashed before use.

A protected artifact's compressed copy is compressed, then sealed under the same content key
(compressed bytes are what the stream cipher sees; ciphertext does not compress). Patches
are unchanged: they go between contents, which is what a device keeps.

The codec is a name, not a closed list, so a later codec does not make this document
unreadable for an SDK that knows only ``zstd``: such an SDK downloads the content instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ._fields import Fields, merge_extra
from .strictjson import JSONObject, JSONValue

ZSTD = "zstd"


@dataclass(frozen=True)
class Compressed:
    """Where to get the compressed copy, its codec and what it must hash to."""

    codec: str
    url: str
    length: int
    sha256: str
    extra: JSONObject = field(default_factory=dict)

    @classmethod
    def from_dict(cls, value: JSONValue, path: str = "compressed") -> Compressed:
        f = Fields(value, path)
        return cls(f.name("codec"), f.url("url"), f.integer("length"), f.sha256("sha256"),
                   f.extra())

    def to_dict(self) -> JSONObject:
        return merge_extra({"codec": self.codec, "url": self.url, "length": self.length,
                            "sha256": self.sha256}, self.extra)


def optional_compressed(f: Fields, path: str) -> Compressed | None:
    raw = f.optional_object("compressed")
    return None if raw is None else Compressed.from_dict(raw, f"{path}.compressed")
