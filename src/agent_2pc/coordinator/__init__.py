"""The coordinator: the transaction engine and the public library over it."""
