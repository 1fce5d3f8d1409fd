"""Client signals: quantities computed from a client's model or data that strategies weigh by."""
from .validation_gradients import as_validation_set, validation_gradient_norms, validation_gradients

__all__: list[str] = ["validation_gradients", "validation_gradient_norms", "as_validation_set"]
