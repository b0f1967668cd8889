"""ModelFleet client SDK: the secure on-device updater and model runtime.

Public surface (everything else is internal)::

    Updater(UpdaterConfig)        the update cycle: poll → verify → select → fetch → patch →
                                  compile → stage → swap (``check_once()``, ``run(stop)``)
    UpdaterConfig, Limits         explicit configuration (no env vars, no global state)
    ModelRuntime                  what the app calls to predict; atomic swaps, circuit breaker
    ShadowConfig                  how the runtime runs shadow candidates (queue, budget, …)
    Transport, Response           the one network seam (fetch, post); UrllibTransport is the
                                  default
    Reporter                      device identity, enrolment and signed telemetry uploads
    Clock, SystemClock            injected time
    Event, EventKind              what the SDK reports to the app
    UpdateResult, ModelResult, Outcome, Via, Prediction
    DeviceProfile                 re-exported from ``manifests``
    errors: ClientSDKError and its subclasses (tree in ``client_sdk.errors``)
"""

from client_sdk.clock import Clock, SystemClock
from client_sdk.config import Limits, UpdaterConfig
from client_sdk.errors import (
    BackendError,
    BackendUnavailableError,
    ClientSDKError,
    ConfigError,
    ContentKeyError,
    DeadlineExceededError,
    FetchError,
    InstallError,
    IntegrityError,
    LocalKeyError,
    MetadataExpiredError,
    ModelNotLoadedError,
    OversizeError,
    PatchFailedError,
    ProtectionError,
    RuntimeSDKError,
    TelemetryError,
    TrustError,
)
from client_sdk.events import Event, EventKind
from client_sdk.http_transport import UrllibTransport
from client_sdk.keystore import FileKeyStore, KeyStore
from client_sdk.loaded import Prediction
from client_sdk.runtime import ModelRuntime
from client_sdk.shadow import ShadowConfig
from client_sdk.telemetry import Reporter
from client_sdk.transport import Response, Transport
from client_sdk.updater import ModelResult, Outcome, Updater, UpdateResult, Via
from manifests import DeviceProfile

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "BackendUnavailableError",
    "ClientSDKError",
    "Clock",
    "ConfigError",
    "ContentKeyError",
    "DeadlineExceededError",
    "DeviceProfile",
    "Event",
    "EventKind",
    "FetchError",
    "FileKeyStore",
    "InstallError",
    "IntegrityError",
    "KeyStore",
    "Limits",
    "LocalKeyError",
    "MetadataExpiredError",
    "ModelNotLoadedError",
    "ModelResult",
    "ModelRuntime",
    "Outcome",
    "OversizeError",
    "PatchFailedError",
    "Prediction",
    "ProtectionError",
    "Reporter",
    "Response",
    "RuntimeSDKError",
    "ShadowConfig",
    "SystemClock",
    "TelemetryError",
    "Transport",
    "TrustError",
    "UpdateResult",
    "Updater",
    "UpdaterConfig",
    "UrllibTransport",
    "Via",
    "__version__",
]
