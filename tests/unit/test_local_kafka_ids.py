"""Cluster ids for the local broker's storage format (no broker)."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from topology import local_kafka
from topology.local_kafka import _cluster_id


def test_cluster_ids_are_16_byte_base64url_and_never_start_with_a_dash() -> None:
    # One id in 64 would start with '-' and be taken for an option by the storage tool.
    ids = [_cluster_id() for _ in range(3_000)]
    assert not [i for i in ids if i.startswith("-")]
    assert len(set(ids)) == len(ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)


def test_the_gc_log_flag_quotes_its_path_and_is_left_out_where_xlog_would_expand_it(tmp_path: Path) -> None:
    import shutil
    import subprocess

    from topology.local_kafka import _gc_log_flags

    assert _gc_log_flags(Path("/data/run%p/gc.log")) == []  # -Xlog expands %p and cannot escape it
    colon = tmp_path / "a:b"
    colon.mkdir()
    flags = _gc_log_flags(colon / "gc.log")
    assert flags == [f'-Xlog:gc:file="{colon}/gc.log"::filecount=2,filesize=10m']
    java = shutil.which("java")
    if java is not None:  # the JVM accepts it and writes there (unquoted, ':' is an -Xlog separator)
        proc = subprocess.run([java, *flags, "-version"], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert (colon / "gc.log").exists()


@pytest.mark.parametrize("raw", ["abc", "0", "70000", "-1"])
def test_a_port_setting_that_is_not_a_port_is_refused_by_name(
    raw: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RUNFOLD_KAFKA_PORT", raw)
    with pytest.raises(
        local_kafka.LocalKafkaError, match=rf"^RUNFOLD_KAFKA_PORT='{raw}' is not a port number"
    ):
        local_kafka.LocalKafkaConfig.from_env()
    monkeypatch.setenv("RUNFOLD_KAFKA_PORT", "19092")
    monkeypatch.setenv("RUNFOLD_KAFKA_CONTROLLER_PORT", raw)
    with pytest.raises(local_kafka.LocalKafkaError, match="RUNFOLD_KAFKA_CONTROLLER_PORT"):
        local_kafka.LocalKafkaConfig.from_env()
