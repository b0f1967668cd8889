"""Hypothesis strategies for manifest documents (shared by property and schema tests)."""

from __future__ import annotations

import string

from hypothesis import strategies as st

from manifests import (
    MAX_SAFE_INTEGER,
    Artifact,
    Filters,
    JSONValue,
    Manifest,
    ModelEntry,
    Patch,
    Release,
    Rollout,
    ShadowThresholds,
)

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,12}", fullmatch=True)
texts = st.text(max_size=20)
words = st.text(min_size=1, max_size=20)
safe_ints = st.integers(-MAX_SAFE_INTEGER, MAX_SAFE_INTEGER)
counts = st.integers(0, MAX_SAFE_INTEGER)
sha256s = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
urls = st.text(alphabet=string.ascii_letters + string.digits + ":/._-%?=&", min_size=1,
               max_size=40)
json_values: st.SearchStrategy[JSONValue] = st.recursive(
    st.none() | st.booleans() | safe_ints | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=8,
)
extras = st.dictionaries(st.text(min_size=1, max_size=8).map(lambda s: "x_" + s), json_values,
                         max_size=2)
ranges = st.lists(st.tuples(st.sampled_from([">=", "<=", ">", "<", "==", "!="]),
                            st.lists(st.integers(0, 999), min_size=1, max_size=3)),
                  min_size=1, max_size=2).map(
    lambda cs: ",".join(op + ".".join(map(str, v)) for op, v in cs))

patches = st.builds(Patch, sha256s, urls, counts, sha256s, names, extra=extras)
artifacts = st.builds(
    Artifact, platform=names, variant=names | st.just(""), format=names, url=urls, length=counts,
    sha256=sha256s,
    compile_settings=st.dictionaries(texts, st.booleans() | safe_ints | texts, max_size=3),
    target=st.dictionaries(texts, texts, max_size=2), patches=st.lists(patches, max_size=2),
    extra=extras,
)
filters = st.builds(
    Filters, platforms=st.lists(names, max_size=2), socs=st.lists(words, max_size=2),
    archs=st.lists(words, max_size=2), os_versions=st.lists(ranges, max_size=2),
    app_versions=st.lists(ranges, max_size=2), device_allow=st.lists(words, max_size=2),
    device_deny=st.lists(words, max_size=2), extra=extras,
)
shadows = st.builds(ShadowThresholds, counts, counts, counts, extra=extras)
rollouts = st.one_of(
    st.builds(Rollout, st.integers(0, 1_000_000), st.text(min_size=1, max_size=10),
              st.just("active"), filters, st.none() | shadows, extras),
    st.builds(Rollout, st.integers(0, 1_000_000), st.text(min_size=1, max_size=10),
              st.just("shadow"), filters, shadows, extras),
)
releases = st.builds(Release, names, rollouts, st.lists(artifacts, max_size=2), extras)
model_entries = st.builds(
    ModelEntry,
    st.lists(releases, max_size=3, unique_by=lambda r: r.version),
    extras,
)
manifests_st = st.builds(
    Manifest, channel=names, serial=st.integers(1, MAX_SAFE_INTEGER), expires=counts,
    models=st.dictionaries(names, model_entries, max_size=2), extra=extras,
)
