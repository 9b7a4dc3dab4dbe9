"""Per-session history the scheduler keeps: earlier turns and the outputs reported so far."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

from policies.types import RequestView, SessionHistory

__all__ = ["SessionTracker"]


@dataclasses.dataclass(slots=True)
class _Session:
    turns: int = 0
    last_input_length: int = 0
    last_arrival_s: float = 0.0
    outputs_known: int = 0
    output_sum: int = 0


class SessionTracker:
    """Bounded LRU of sessions: what is known of a session when its next request arrives."""

    def __init__(self, max_sessions: int = 100_000) -> None:
        if max_sessions <= 0:
            raise ValueError(f"max_sessions must be positive, got {max_sessions}")
        self._max = max_sessions
        self._sessions: OrderedDict[str, _Session] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def history(self, session_id: str | None, now: float) -> SessionHistory | None:
        """The session's history at ``now``; None for a request without a known session."""
        if session_id is None:
            return None
        s = self._sessions.get(session_id)
        if s is None:
            return SessionHistory()
        return SessionHistory(
            turns=s.turns,
            last_input_length=s.last_input_length,
            since_last_s=max(now - s.last_arrival_s, 0.0),
            outputs_known=s.outputs_known,
            mean_output=s.output_sum / s.outputs_known if s.outputs_known else None,
        )

    def attach(self, request: RequestView, now: float) -> RequestView:
        """The request with its session history filled in (unchanged if already given)."""
        if request.history is not None or request.session_id is None:
            return request
        history = self.history(request.session_id, now)
        if type(request) is not RequestView:
            return dataclasses.replace(request, history=history)
        return RequestView(  # dataclasses.replace, without its per-call field inspection
            request.chain, request.block_size, request.input_length, request.max_tokens,
            request.session_id, request.arrival_s, request.request_id, history,
        )  # fmt: skip

    def arrived(self, request: RequestView, now: float) -> None:
        """Count the request as a turn of its session."""
        if request.session_id is None:
            return
        s = self._sessions.get(request.session_id)
        if s is None:
            s = self._sessions[request.session_id] = _Session()
            while len(self._sessions) > self._max:
                self._sessions.popitem(last=False)
        else:
            self._sessions.move_to_end(request.session_id)
        s.turns += 1
        s.last_input_length = request.input_length
        s.last_arrival_s = now

    def finished(self, session_id: str | None, output_tokens: int) -> None:
        """A request of the session reported its output length."""
        if session_id is None:
            return
        s = self._sessions.get(session_id)
        if s is not None:
            s.outputs_known += 1
            s.output_sum += output_tokens
