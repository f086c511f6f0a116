"""Consuming committed run events downstream: a plain confluent-kafka consumer helper
(`consumer.RunEventConsumer`) and a faust-streaming codec + model (`faust_codec`)."""

from processors.downstream.consumer import RunEventConsumer

__all__ = ["RunEventConsumer"]
