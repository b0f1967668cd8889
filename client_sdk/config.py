"""``UpdaterConfig`` and ``Limits``: everything the updater needs, passed in explicitly.

The SDK reads no environment variables and keeps no global state: the base URL, the pinned root,
the device profile, the data directory, byte caps, deadlines, the poll schedule, the clock and
the transport all arrive here.
"""

from __future__ import annotations

import random
import urllib.parse
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from client_sdk.clock import Clock, SystemClock
from client_sdk.errors import ConfigError
from client_sdk.events import EventCallback
from client_sdk.fsutil import check_name
from client_sdk.keystore import KeyStore
from client_sdk.protection import use_keystore
from client_sdk.transport import Transport
from manifests import DeviceProfile

if TYPE_CHECKING:
    from client_sdk.runtime import ModelRuntime

MiB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    """Byte caps: nothing the network sends is read past these (endless-data attacks)."""

    max_root_bytes: int = 1 * MiB
    max_manifest_bytes: int = 4 * MiB
    max_artifact_bytes: int = 4096 * MiB
    max_root_rotations: int = 64


@dataclass
class UpdaterConfig:
    """Configuration of one ``Updater`` (one channel, one device, one data directory).

    ``pinned_root`` is the root document envelope (bytes) shipped inside the app. ``transport``
    defaults to the urllib HTTP transport. ``fault_hook`` is called with the name of each
    install step (see ``client_sdk.install.STEPS``); tests use it to kill the process there.
    """

    base_url: str
    channel: str
    pinned_root: bytes
    device: DeviceProfile
    data_dir: Path
    limits: Limits = field(default_factory=Limits)
    update_deadline_seconds: float = 900.0
    request_timeout_seconds: float = 30.0
    poll_interval_seconds: float = 900.0
    poll_jitter: float = 0.1
    backoff_base_seconds: float = 30.0
    backoff_cap_seconds: float = 6 * 3600.0
    models: Sequence[str] | None = None
    variants: Mapping[str, str] = field(default_factory=dict)
    # Models whose bundle holds one artifact per input-shape variant the release offers this
    # device (e.g. 360p/720p/1080p): all are loaded once and `ModelRuntime.predict(...,
    # shape_variant=...)` switches between them without reloading.
    all_shape_variants: Collection[str] = ()
    formats: Sequence[str] | None = None
    clock: Clock = field(default_factory=SystemClock)
    transport: Transport | None = None
    on_event: EventCallback | None = None
    runtime: ModelRuntime | None = None
    rng: random.Random = field(default_factory=random.Random)
    fault_hook: Callable[[str], None] | None = None
    # Where protected releases' device keys live (client_sdk/keystore.py); None: 0600 files
    # under data_dir/keys. The Android Keystore / iOS Keychain plug in here.
    keystore: KeyStore | None = None

    def __post_init__(self) -> None:
        if self.keystore is not None:
            use_keystore(self.data_dir, self.keystore)
        parts = urllib.parse.urlsplit(self.base_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"base_url {self.base_url!r} must be an absolute http(s) URL, "
                "e.g. https://updates.example.com"
            )
        check_name("channel", self.channel)
        if not self.pinned_root:
            raise ConfigError(
                "pinned_root is empty: pass the root.json envelope shipped with the app"
            )
        self.data_dir = Path(self.data_dir)
        for name in ("update_deadline_seconds", "request_timeout_seconds", "poll_interval_seconds",
                     "backoff_base_seconds", "backoff_cap_seconds"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive")
        if not 0 <= self.poll_jitter < 1:
            raise ConfigError("poll_jitter must be in [0, 1)")
