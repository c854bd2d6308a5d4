"""casync primitives: the per-tensor operations (encode, send, recv, merge, decode)
and the codec library they run.  Knows nothing of graphs or Ray."""
from .codecs import (
    Codec,
    Payload,
    available_codecs,
    get_codec,
    payload_nbytes,
    register_codec,
)

__all__ = ["Codec", "Payload", "available_codecs", "get_codec", "payload_nbytes", "register_codec"]
