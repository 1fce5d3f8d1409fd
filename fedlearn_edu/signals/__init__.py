"""Client signals: quantities computed from a client's model or data that strategies weigh by."""
from .loss import global_model_loss

__all__: list[str] = ["global_model_loss"]
