"""casync primitives: the per-tensor operations (encode, send, recv, merge, decode)
and the codec library they run.  Knows nothing of graphs or Ray."""

if __name__ != "casync.primitives":  # the repository's primitives/ folder, imported by its bare name
    raise ImportError(f"primitives/ installs as casync.primitives: import that (a bare {__name__!r} would be a second "
                      "copy of its registry)")

from .codecs import (
    Codec,
    Payload,
    available_codecs,
    get_codec,
    payload_nbytes,
    register_codec,
)

__all__ = ["Codec", "Payload", "available_codecs", "get_codec", "payload_nbytes", "register_codec"]
