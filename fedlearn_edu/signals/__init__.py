"""Client signals: quantities computed from a client's model or data that strategies weigh by."""

__all__: list[str] = []
