"""Channels: a name devices poll, holding the releases offered on it. A channel never exists
unsigned: its row and its first manifest commit in one transaction, whether it is created on
its own (`create_channel`) or by its first rollout (`open_or_create`, used by
server/rollouts/service.py `start_rollout`, so that start signs once).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from server.db import audit
from server.db import models as db
from server.publish.errors import ChannelNotFoundError
from server.publish.publisher import (
    Audited,
    PublishedManifest,
    Publisher,
    find_locked_channel,
    latest_manifest,
    publish_change,
    publish_channel,
)
from server.rollouts.errors import ChannelExistsError, InvalidRolloutError

CHANNEL_NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")


@dataclass(frozen=True)
class ChannelSummary:
    name: str
    description: str
    serial: int | None
    manifest_sha256: str | None
    expires: int | None


def check_channel_name(name: str) -> None:
    if not CHANNEL_NAME.fullmatch(name):
        raise InvalidRolloutError(
            f"channel name {name!r} is not allowed",
            field="name", fix="use 1–64 lowercase letters, digits, '.', '_' or '-'",
        )


def _add(session: Session, name: str, description: str, actor: str) -> db.Channel:
    """A new channel row in the caller's transaction, audited. The INSERT serialises
    concurrent creators (row lock on PostgreSQL, the write lock on SQLite): the loser's flush
    fails before it signs anything, and `publish_change` retries it."""
    row = db.Channel(name=name, description=description)
    session.add(row)
    audit.record(session, actor, "channel.create", f"channel:{name}")
    session.flush()
    return row


def open_or_create(description: str, actor: str) -> Callable[[Session, str], db.Channel]:
    """`publish_change`'s `open_channel`: the locked row, or a new one (name checked)."""

    def open_channel(session: Session, name: str) -> db.Channel:
        row = find_locked_channel(session, name)
        if row is not None:
            return row
        check_channel_name(name)
        return _add(session, name, description, actor)

    return open_channel


def create_channel(factory: sessionmaker[Session], pub: Publisher, name: str, *,
                   description: str = "", actor: str) -> PublishedManifest:
    """Create a channel and publish its first (empty) manifest, serial 1."""
    check_channel_name(name)
    pub.signer.keyid()  # KeyStoreError now, before anything is written

    def open_new(session: Session, name: str) -> db.Channel:
        if find_locked_channel(session, name) is not None:  # also a lost race's retry
            raise ChannelExistsError(f"channel {name!r} already exists")
        return _add(session, name, description, actor)

    def change(session: Session, ch: db.Channel) -> Audited:
        return Audited("channel.create", ch.name, {})

    _, published = publish_change(factory, pub, name, change, open_channel=open_new)
    assert published is not None
    return published


def _summary(session: Session, ch: db.Channel) -> ChannelSummary:
    m = latest_manifest(session, ch.id)
    return ChannelSummary(ch.name, ch.description, m.serial if m else None,
                          m.sha256 if m else None, m.expires if m else None)


def channel_summary(session: Session, name: str) -> ChannelSummary:
    ch = session.scalars(select(db.Channel).where(db.Channel.name == name)).first()
    if ch is None:
        raise ChannelNotFoundError(f"no channel named {name!r}")
    return _summary(session, ch)


def list_channels(session: Session) -> list[ChannelSummary]:
    return [_summary(session, ch)
            for ch in session.scalars(select(db.Channel).order_by(db.Channel.name))]


def channel_names(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(db.Channel.name).order_by(db.Channel.name)))


def republish(factory: sessionmaker[Session], pub: Publisher, channel: str, *,
              actor: str) -> ChannelSummary:
    """Sign the channel again as it stands (new serial, fresh expiry)."""
    publish_channel(factory, pub, channel, actor=actor)
    with factory() as session:
        return channel_summary(session, channel)


def create(factory: sessionmaker[Session], pub: Publisher, name: str, *, description: str,
           actor: str) -> ChannelSummary:
    """`create_channel`, answered with the channel's summary."""
    create_channel(factory, pub, name, description=description, actor=actor)
    with factory() as session:
        return channel_summary(session, name)
