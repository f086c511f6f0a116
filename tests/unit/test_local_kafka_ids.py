"""Cluster ids for the local broker's storage format (no broker)."""

from __future__ import annotations

import base64

from topology.local_kafka import _cluster_id


def test_cluster_ids_are_16_byte_base64url_and_never_start_with_a_dash() -> None:
    # One id in 64 would start with '-' and be taken for an option by the storage tool.
    ids = [_cluster_id() for _ in range(3_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
