"""agent-2pc: database-grade transactions for coding agents.

Stage file changes without touching the tree, look at them, then commit them atomically and
durably through a two-phase commit with a write-ahead log, or abort leaving nothing behind.
"""

from .coordinator.client import Agent2PC, Transaction
from .errors import Agent2PCError, TransactionAborted

__all__ = ["Agent2PC", "Agent2PCError", "Transaction", "TransactionAborted"]
__version__ = "0.1.0"
