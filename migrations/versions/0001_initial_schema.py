"""initial schema

Revision ID: 0001
Revises: 
Create Date: 2026-11-29 11:58:16.677743
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('scopes', sa.JSON(), nullable=False),
    sa.Column('revoked', sa.Boolean(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    op.create_table('audit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('actor', sa.String(length=128), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('target', sa.String(length=255), nullable=False),
    sa.Column('details', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_audit_events_at'), ['at'], unique=False)

    op.create_table('channels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_channels')),
    sa.UniqueConstraint('name', name=op.f('uq_channels_name'))
    )
    op.create_table('devices',
    sa.Column('id', sa.String(length=128), nullable=False),
    sa.Column('profile', sa.JSON(), nullable=False),
    sa.Column('first_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_seen_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_devices'))
    )
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_devices_last_seen_at'), ['last_seen_at'], unique=False)

    op.create_table('models',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=64), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('task', sa.String(length=32), nullable=False),
    sa.Column('owner', sa.String(length=128), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_models')),
    sa.UniqueConstraint('name', name=op.f('uq_models_name'))
    )
    op.create_table('root_documents',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_root_documents')),
    sa.UniqueConstraint('version', name=op.f('uq_root_documents_version'))
    )
    op.create_table('model_versions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('metadata_json', sa.JSON(), nullable=False),
    sa.Column('source_format', sa.String(length=16), nullable=False),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_by', sa.String(length=128), nullable=False),
    sa.ForeignKeyConstraint(['model_id'], ['models.id'], name=op.f('fk_model_versions_model_id_models')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_versions')),
    sa.UniqueConstraint('model_id', 'version', name=op.f('uq_model_versions_model_id'))
    )
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_model_versions_model_id'), ['model_id'], unique=False)

    op.create_table('signed_manifests',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('channel_id', sa.Integer(), nullable=False),
    sa.Column('serial', sa.BigInteger(), nullable=False),
    sa.Column('blob_key', sa.String(length=512), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('expires', sa.BigInteger(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['channel_id'], ['channels.id'], name=op.f('fk_signed_manifests_channel_id_channels')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_signed_manifests')),
    sa.UniqueConstraint('channel_id', 'serial', name=op.f('uq_signed_manifests_channel_id'))
    )
    with op.batch_alter_table('signed_manifests', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_signed_manifests_channel_id'), ['channel_id'], unique=False)

    op.create_table('builds',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('variant', sa.String(length=64), nullable=False),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('compile_settings', sa.JSON(), nullable=False),
    sa.Column('log', sa.Text(), nullable=False),
    sa.Column('gates_report', sa.JSON(), nullable=True),
    sa.Column('error', sa.Text(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('locked_by', sa.String(length=128), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'], name=op.f('fk_builds_version_id_model_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_builds')),
    sa.UniqueConstraint('version_id', 'platform', 'variant', name=op.f('uq_builds_version_id'))
    )
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.create_index('ix_builds_state_next_attempt_at', ['state', 'next_attempt_at'], unique=False)
        batch_op.create_index(batch_op.f('ix_builds_version_id'), ['version_id'], unique=False)

    op.create_table('releases',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('channel_id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('share_ppm', sa.Integer(), nullable=False),
    sa.Column('salt', sa.String(length=64), nullable=False),
    sa.Column('mode', sa.String(length=32), nullable=False),
    sa.Column('filters', sa.JSON(), nullable=False),
    sa.Column('pinned_devices', sa.JSON(), nullable=False),
    sa.Column('denied_devices', sa.JSON(), nullable=False),
    sa.Column('shadow_max_kl_micro', sa.BigInteger(), nullable=True),
    sa.Column('shadow_max_latency_p99_us', sa.BigInteger(), nullable=True),
    sa.Column('shadow_min_samples', sa.Integer(), nullable=True),
    sa.Column('state', sa.String(length=32), nullable=False),
    sa.Column('state_reason', sa.Text(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['channel_id'], ['channels.id'], name=op.f('fk_releases_channel_id_channels')),
    sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'], name=op.f('fk_releases_version_id_model_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_releases')),
    sa.UniqueConstraint('channel_id', 'version_id', name=op.f('uq_releases_channel_id'))
    )
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_releases_channel_id'), ['channel_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_releases_version_id'), ['version_id'], unique=False)

    op.create_table('source_uploads',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('filename', sa.String(length=255), nullable=False),
    sa.Column('format', sa.String(length=16), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('blob_key', sa.String(length=512), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'], name=op.f('fk_source_uploads_version_id_model_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_source_uploads')),
    sa.UniqueConstraint('version_id', 'kind', name=op.f('uq_source_uploads_version_id'))
    )
    with op.batch_alter_table('source_uploads', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_source_uploads_version_id'), ['version_id'], unique=False)

    op.create_table('artifacts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('version_id', sa.Integer(), nullable=False),
    sa.Column('build_id', sa.Integer(), nullable=True),
    sa.Column('platform', sa.String(length=32), nullable=False),
    sa.Column('variant', sa.String(length=64), nullable=False),
    sa.Column('format', sa.String(length=32), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('blob_key', sa.String(length=512), nullable=False),
    sa.Column('target', sa.JSON(), nullable=False),
    sa.Column('compile_settings', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['build_id'], ['builds.id'], name=op.f('fk_artifacts_build_id_builds')),
    sa.ForeignKeyConstraint(['version_id'], ['model_versions.id'], name=op.f('fk_artifacts_version_id_model_versions')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_artifacts')),
    sa.UniqueConstraint('version_id', 'platform', 'variant', name=op.f('uq_artifacts_version_id'))
    )
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_artifacts_sha256'), ['sha256'], unique=False)
        batch_op.create_index(batch_op.f('ix_artifacts_version_id'), ['version_id'], unique=False)

    op.create_table('telemetry_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), nullable=False),
    sa.Column('device_id', sa.String(length=128), nullable=False),
    sa.Column('release_id', sa.Integer(), nullable=True),
    sa.Column('model', sa.String(length=64), nullable=False),
    sa.Column('version', sa.String(length=64), nullable=False),
    sa.Column('kind', sa.String(length=32), nullable=False),
    sa.Column('kl_micro', sa.BigInteger(), nullable=True),
    sa.Column('latency_p99_us', sa.BigInteger(), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=True),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('received_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['release_id'], ['releases.id'], name=op.f('fk_telemetry_events_release_id_releases')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_telemetry_events'))
    )
    with op.batch_alter_table('telemetry_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_telemetry_events_device_id'), ['device_id'], unique=False)
        batch_op.create_index('ix_telemetry_events_release_id_received_at', ['release_id', 'received_at'], unique=False)

    op.create_table('patches',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('from_artifact_id', sa.Integer(), nullable=False),
    sa.Column('to_artifact_id', sa.Integer(), nullable=False),
    sa.Column('algorithm', sa.String(length=32), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=False),
    sa.Column('length', sa.BigInteger(), nullable=False),
    sa.Column('blob_key', sa.String(length=512), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['from_artifact_id'], ['artifacts.id'], name=op.f('fk_patches_from_artifact_id_artifacts')),
    sa.ForeignKeyConstraint(['to_artifact_id'], ['artifacts.id'], name=op.f('fk_patches_to_artifact_id_artifacts')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_patches')),
    sa.UniqueConstraint('from_artifact_id', 'to_artifact_id', 'algorithm', name=op.f('uq_patches_from_artifact_id'))
    )
    with op.batch_alter_table('patches', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_patches_from_artifact_id'), ['from_artifact_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_patches_to_artifact_id'), ['to_artifact_id'], unique=False)




def downgrade() -> None:

    with op.batch_alter_table('patches', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_patches_to_artifact_id'))
        batch_op.drop_index(batch_op.f('ix_patches_from_artifact_id'))

    op.drop_table('patches')
    with op.batch_alter_table('telemetry_events', schema=None) as batch_op:
        batch_op.drop_index('ix_telemetry_events_release_id_received_at')
        batch_op.drop_index(batch_op.f('ix_telemetry_events_device_id'))

    op.drop_table('telemetry_events')
    with op.batch_alter_table('artifacts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_artifacts_version_id'))
        batch_op.drop_index(batch_op.f('ix_artifacts_sha256'))

    op.drop_table('artifacts')
    with op.batch_alter_table('source_uploads', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_source_uploads_version_id'))

    op.drop_table('source_uploads')
    with op.batch_alter_table('releases', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_releases_version_id'))
        batch_op.drop_index(batch_op.f('ix_releases_channel_id'))

    op.drop_table('releases')
    with op.batch_alter_table('builds', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_builds_version_id'))
        batch_op.drop_index('ix_builds_state_next_attempt_at')

    op.drop_table('builds')
    with op.batch_alter_table('signed_manifests', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_signed_manifests_channel_id'))

    op.drop_table('signed_manifests')
    with op.batch_alter_table('model_versions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_model_versions_model_id'))

    op.drop_table('model_versions')
    op.drop_table('root_documents')
    op.drop_table('models')
    with op.batch_alter_table('devices', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_devices_last_seen_at'))

    op.drop_table('devices')
    op.drop_table('channels')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_audit_events_at'))

    op.drop_table('audit_events')
    op.drop_table('api_tokens')

