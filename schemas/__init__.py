"""runfold's Avro contracts (`*.avsc`) and the codec that speaks them (see `schemas.codec`)."""

from schemas.codec import TOPIC_KINDS, Codec, DecodeError, EncodeError, get_codec

__all__ = ["TOPIC_KINDS", "Codec", "DecodeError", "EncodeError", "get_codec"]
