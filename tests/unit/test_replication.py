"""What replication runfold's topics want on a cluster (topology.replication): the settings, else
the cluster's own default, else 3 on >= 3 brokers; min ISR RF-1 at most 2; the brokers'
exactly-once settings that are weaker than the topics are named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topology.replication import (
    BrokerSetting,
    ClusterFacts,
    ReplicationUnworkable,
    exactly_once_warnings,
    wanted_replication,
)
from topology.settings import KafkaSettings


def _facts(brokers: int, **settings: tuple[int, bool]) -> ClusterFacts:
    return ClusterFacts(
        brokers, {k.replace("_", "."): BrokerSetting(v, explicit) for k, (v, explicit) in settings.items()}
    )


def test_settings_default_leaves_replication_to_the_cluster() -> None:
    s = KafkaSettings(bootstrap_servers="k:9092")
    assert s.replication_factor is None and s.min_insync_replicas is None


def test_three_brokers_without_a_cluster_default_give_rf_3_and_min_isr_2() -> None:
    # Kafka's built-in default.replication.factor is 1: not the operator's choice, so not followed
    want = wanted_replication(KafkaSettings(), _facts(3, default_replication_factor=(1, False)))
    assert (want.factor, want.min_insync) == (3, 2)
    assert "3 broker" in want.factor_why


def test_the_clusters_own_default_wins_over_the_broker_count() -> None:
    want = wanted_replication(KafkaSettings(), _facts(5, default_replication_factor=(4, True)))
    assert (want.factor, want.min_insync) == (4, 2)
    assert "default.replication.factor" in want.factor_why


def test_a_single_local_broker_gives_rf_1_and_min_isr_1() -> None:
    want = wanted_replication(KafkaSettings(), _facts(1, default_replication_factor=(1, True)))
    assert (want.factor, want.min_insync) == (1, 1)
    assert (wanted_replication(KafkaSettings(), _facts(1)).factor) == 1


def test_configured_values_win() -> None:
    s = KafkaSettings(replication_factor=2, min_insync_replicas=1)
    want = wanted_replication(s, _facts(3, default_replication_factor=(3, True)))
    assert (want.factor, want.min_insync) == (2, 1)
    assert "configured" in want.factor_why and "configured" in want.min_insync_why


def test_unworkable_replication_is_refused_with_both_values() -> None:
    with pytest.raises(ReplicationUnworkable, match=r"min.insync.replicas 3 .* replication factor 2"):
        wanted_replication(KafkaSettings(replication_factor=2, min_insync_replicas=3), _facts(3))
    with pytest.raises(ReplicationUnworkable, match=r"replication factor 3 .* 2 broker"):
        wanted_replication(KafkaSettings(replication_factor=3), _facts(2))


@given(st.integers(1, 12), st.one_of(st.none(), st.integers(1, 12)))
def test_min_isr_leaves_room_for_one_broker_down(brokers: int, cluster_default: int | None) -> None:
    facts = _facts(
        brokers,
        **({} if cluster_default is None else {"default_replication_factor": (cluster_default, True)}),
    )
    try:
        want = wanted_replication(KafkaSettings(), facts)
    except ReplicationUnworkable:
        assert cluster_default is not None and cluster_default > brokers
        return
    assert 1 <= want.min_insync <= 2 and want.min_insync <= want.factor
    if want.factor >= 2:
        assert want.min_insync <= want.factor - 1  # one replica down: writes still acknowledged
    if cluster_default is None:
        assert want.factor == min(3, brokers)


def test_weak_exactly_once_broker_settings_are_each_named() -> None:
    facts = _facts(
        3,
        transaction_state_log_replication_factor=(1, True),
        transaction_state_log_min_isr=(1, True),
        offsets_topic_replication_factor=(3, False),
    )
    warnings = exactly_once_warnings(wanted_replication(KafkaSettings(), facts), facts)
    assert len(warnings) == 2, warnings
    assert "transaction.state.log.replication.factor is 1, wanted >= 3" in warnings[0]
    assert "transaction.state.log.min.isr is 1, wanted >= 2" in warnings[1]
    strong = _facts(
        3,
        transaction_state_log_replication_factor=(3, True),
        transaction_state_log_min_isr=(2, True),
        offsets_topic_replication_factor=(3, True),
    )
    assert exactly_once_warnings(wanted_replication(KafkaSettings(), strong), strong) == []
