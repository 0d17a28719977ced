"""The copies of an image's distribution plan carried out, pipelined.

Why pipelined rather than round by round: a copy can start as soon as its source holds the
image and has finished its previous send; waiting for the whole round to end left nodes idle
behind the slowest copy of the round. The plan itself (who sends to whom, in which round) is
`distribution`'s; what one copy does is the caller's (`send`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from provisioning.distribution import Transfer
from vjob.errors import VjobError


def carry_out(
    transfers: Iterable[Transfer], what: str, send: Callable[[Transfer], None], done: Callable[[Transfer], None]
) -> None:
    """`send` every transfer once its source holds the image, one send at a time per source;
    `done` for each that completed, in the plan's order. A failed copy fails the copies that
    depended on it, and the first error is raised after the others were done. `what` names
    the image in those errors."""
    ordered = sorted(transfers, key=lambda t: t.round)
    delivered: dict[str, Future[None]] = {}
    last_sent: dict[str, Future[None]] = {}
    submitted: list[tuple[Transfer, Future[None]]] = []
    # Dependencies are always submitted before their dependents and the pool is FIFO, so a
    # waiting copy never holds the worker its dependency needs.
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(ordered)))) as pool:
        for t in ordered:
            fut = pool.submit(_send_after, delivered.get(t.source), last_sent.get(t.source), what, t, send)
            delivered[t.target] = last_sent[t.source] = fut
            submitted.append((t, fut))
        first_error: BaseException | None = None
        for t, fut in submitted:
            try:
                fut.result()
            except VjobError as exc:
                first_error = first_error or exc
                continue
            done(t)
    if first_error is not None:
        raise first_error


def _send_after(
    received: Future[None] | None,
    previous: Future[None] | None,
    what: str,
    t: Transfer,
    send: Callable[[Transfer], None],
) -> None:
    """Copy once the source holds the image (`received`) and is done with `previous`."""
    if previous is not None:
        wait([previous])  # one send at a time per node; its failure is not ours
    if received is not None:
        try:
            received.result()
        except VjobError:
            raise VjobError(
                f"{what}: copy {t.source} -> {t.target} not done: {t.source} did not receive the image"
            ) from None
    send(t)
