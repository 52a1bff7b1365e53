from knowledge.store import Knowledge

__all__ = ["Knowledge"]
