"""A strategy's explicit server state threaded through rounds, for tests that step it by hand."""

from __future__ import annotations


class Server:
    """The server side of one run: ``strategy.init_state`` once, then ``aggregate`` round after round.

    Args:
        strategy: the strategy.
        params: theta_0 ``{name: Tensor}``.
        num_clients: N.
        model: the architecture (IFCA needs it; ``None`` otherwise).
        seed: the run's seed.
    """

    def __init__(self, strategy, params, num_clients: int = 4, model=None, seed: int = 0):
        self.strategy = strategy
        self.state, self.client_state = strategy.init_state(params, model, num_clients, seed)

    @property
    def params(self):
        """The server's model(s) now."""
        return self.strategy.server_params(self.state)

    def aggregate(self, updates):
        """One server step; returns ``(new server model, diagnostics)`` and keeps the new state."""
        self.state, diag = self.strategy.aggregate(self.state, updates)
        return self.params, diag

    def direction(self, updates, **kwargs):
        """The strategy's direction; returns ``(g, diagnostics)`` and keeps the new state."""
        g, self.state, diag = self.strategy.direction(self.state, updates, **kwargs)
        return g, diag
