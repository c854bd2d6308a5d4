"""What the per-rank executors send each other besides payload bodies: the tags, and abort notices.

Every transfer of a step is a body (``body_tag``), when NaN/Inf rode along a side channel (``side_tag``), and a
header naming it (``HEADER_TAG``, :data:`casync.primitives.wire.HEADER_WORDS` int64 words: transfer, step, side entries,
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

from casync.primitives.wire import HEADER_WORDS

from ..errors import SyncError, WorkerLostError

HEADER_TAG = 1
ABORT_TAG = 0  # the reason after an abort header
#: the transfer of an abort header
ABORTED = -1
#: what an abort header says happened (its third word): the sender's step failed, or it lost a peer (named first
#: in the reason), which its own peers then raise as a WorkerLostError naming that peer
FAILED, LOST = 0, 1
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


def post_abort_notices(channel: Any, step: int, peers: Iterable[str], reason: str, kind: int = FAILED
                       ) -> tuple[Any, ...]:
    """Post to each of ``peers`` an abort header for ``step`` (``kind``: :data:`FAILED` or :data:`LOST`) and
    ``reason`` (without waiting for them to leave: :func:`wait_sent`).  Returns the buffers and handles, to keep
    alive until sent."""
    header = np.zeros(HEADER_WORDS, np.int64)
    header[:3] = ABORTED, step, kind
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
    return header, text, handles


def wait_sent(notices: tuple[Any, ...], name: str) -> None:
    """Wait at most :data:`NOTICE_WAIT_S` for the handles of :func:`post_abort_notices` (a dead peer's never
    complete; the buffers stay alive in ``notices`` whatever happens)."""
    handles = notices[-1]

    def wait() -> None:
        for handle in handles:
            try:
                handle.wait()
            except Exception:
                pass

    waiter = threading.Thread(target=wait, daemon=True, name=f"casync-notice-{name}")
    waiter.start()
    waiter.join(NOTICE_WAIT_S)


class HeaderLedger:
    """The headers an actor owes each peer per step (``owed``), how many it has sent, and the abort notices that
    replace the rest when its step fails.  :attr:`lock` is also the executor's gate for opening and closing a
    step: a failure sees a step fully open or not at all, and once its notices are posted no header leaves, so
    each peer gets its next header or the notice, never both, and never neither."""

    def __init__(self, channel: Any, owed: dict[str, int]):
        self.channel = channel
        self.owed = dict(owed)
        self.lock = threading.Lock()
        self.step: int | None = None  # the open step (set and cleared holding the lock)
        self.sent: dict[str, int] = {}
        self.told: int | None = None  # the step whose failure the peers were told of
        self.notices: tuple[Any, ...] = ()  # the last notices' buffers and handles, alive until sent
        #: whether notices are ever sent: a channel whose own abort tells the peers needs no lock around a header
        #: (one that writes inline, as sockets may, must not hold it while a dead peer's socket blocks the write)
        self.notifies = not tells_peers(channel)

    def opened(self, step: int | None) -> None:
        """``step`` is open (None: closed); call holding :attr:`lock`."""
        self.step = step
        self.sent = dict.fromkeys(self.owed, 0)

    def send(self, header: np.ndarray, peer: str) -> Any:
        """Send ``peer`` its next header; None (nothing sent) once the step's abort notices went instead."""
        if not self.notifies:
            return self.channel.isend(header.view(np.uint8), peer, HEADER_TAG)
        with self.lock:
            if self.told == self.step:
                return None
            handle = self.channel.isend(header.view(np.uint8), peer, HEADER_TAG)
            self.sent[peer] += 1
            return handle

    def tell(self, reason: str, kind: int = FAILED) -> None:
        """Abort notices to the peers still owed a header, unless the channel's own abort tells them; once a
        step.  Waits at most :data:`NOTICE_WAIT_S` for them to leave."""
        if not self.notifies:
            return
        with self.lock:
            if self.step is None or self.told == self.step:
                return
            self.told = self.step
            peers = [peer for peer, count in self.owed.items() if self.sent.get(peer, 0) < count]
            if not peers:
                return
            self.notices = post_abort_notices(self.channel, self.step, peers, reason, kind)
        wait_sent(self.notices, getattr(self.channel, "actor", ""))


def abort_error(channel: Any, actor: str, peer: str, kind: int) -> SyncError:
    """The error for ``peer``'s abort header of ``kind``, which ``actor`` received: its reason is the next message
    from it.  The error carries that reason and kind on (``abort_reason``, ``abort_kind``), so the actor's own
    peers are told the first failure; a lost peer's is a :class:`WorkerLostError` naming the actor lost."""
    text = np.zeros(REASON_BYTES, np.uint8)
    channel.irecv(text, peer, ABORT_TAG).wait()
    reason = bytes(text).rstrip(b"\0").decode("utf-8", "replace")
    message = f"{actor}: {peer} aborted its data plane: {reason}"
    error = WorkerLostError(message, lost=reason.split(" ", 1)[0]) if kind == LOST else SyncError(message)
    error.abort_reason, error.abort_kind = reason, kind  # type: ignore[attr-defined]
    return error


def abort_reason(actor: str, step: int | None, exc: BaseException) -> tuple[str, int]:
    """What ``actor``'s abort notices say of ``exc``, its failure in ``step``, and their kind: a peer's reason
    passed on as it came, a peer it lost named first, else its own failure."""
    if getattr(exc, "abort_reason", None):
        return exc.abort_reason, getattr(exc, "abort_kind", FAILED)  # type: ignore[attr-defined]
    lost = getattr(exc, "lost", None)
    if lost:
        return f"{lost} was lost in step {step} ({exc})"[:REASON_BYTES], LOST
    return f"{actor} failed in step {step}: {type(exc).__name__}: {exc}"[:REASON_BYTES], FAILED
