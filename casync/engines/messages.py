"""What the per-rank executors send each other besides payload bodies: the tags, and abort notices.

Every transfer of a step is a body (``body_tag``), when NaN/Inf rode along a side channel (``side_tag``), and a
header naming it (``HEADER_TAG``, :data:`primitives.wire.HEADER_WORDS` int64 words: transfer, step, side entries,
spare), which the receiver posts ahead, so headers from a peer fill in the order the peer sends them.  An actor
whose step fails, over a channel whose abort tells no peer (a torch.distributed group, where a receive waits for
its own peer and tag alone), sends each peer still waiting for a header from it an *abort header* (transfer
:data:`ABORTED`) in place of that header and the reason after it: the peer fails at once naming the failure
instead of at its timeout.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from primitives.wire import HEADER_WORDS

from ..errors import SyncError

HEADER_TAG = 1
ABORT_TAG = 0  # the reason after an abort header
#: the transfer of an abort header
ABORTED = -1
REASON_BYTES = 256
#: how long a failing actor waits for its abort notices to leave before its channel aborts
NOTICE_WAIT_S = 0.5


def body_tag(transfer: int) -> int:
    return 2 + 2 * transfer


def side_tag(transfer: int) -> int:
    return 3 + 2 * transfer


def tells_peers(channel: Any) -> bool:
    """Whether ``channel``'s own abort makes its peers' waiting receives fail (see the Channel protocol)."""
    return bool(getattr(channel, "tells_peers_on_abort", False))


def send_abort_notices(channel: Any, step: int, peers: Iterable[str], reason: str) -> tuple[Any, ...]:
    """Send each of ``peers`` an abort header for ``step`` and ``reason``; waits at most :data:`NOTICE_WAIT_S`
    for them to leave (a dead peer's never do).  Returns the buffers and handles, to keep alive until sent."""
    header = np.zeros(HEADER_WORDS, np.int64)
    header[:2] = ABORTED, step
    text = np.zeros(REASON_BYTES, np.uint8)
    encoded = reason.encode("utf-8", "replace")[:REASON_BYTES]
    text[:len(encoded)] = np.frombuffer(encoded, np.uint8)
    handles = []
    for peer in peers:
        try:
            handles.append(channel.isend(header.view(np.uint8), peer, HEADER_TAG))
            handles.append(channel.isend(text, peer, ABORT_TAG))
        except Exception:  # a channel already aborted or a peer gone: its timeout tells it
            continue

    def wait() -> None:
        for handle in handles:
            try:
                handle.wait()
            except Exception:
                pass

    waiter = threading.Thread(target=wait, daemon=True, name=f"casync-notice-{getattr(channel, 'actor', '')}")
    waiter.start()
    waiter.join(NOTICE_WAIT_S)
    return header, text, handles


def abort_error(channel: Any, actor: str, peer: str) -> SyncError:
    """The error for ``peer``'s abort header, which ``actor`` received: its reason is the next message from it.
    The error carries that reason on (``abort_reason``), so the actor's own peers are told the first failure."""
    text = np.zeros(REASON_BYTES, np.uint8)
    channel.irecv(text, peer, ABORT_TAG).wait()
    reason = bytes(text).rstrip(b"\0").decode("utf-8", "replace")
    error = SyncError(f"{actor}: {peer} aborted its data plane: {reason}")
    error.abort_reason = reason  # type: ignore[attr-defined]
    return error
