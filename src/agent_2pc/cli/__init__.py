"""The command-line face of agent-2pc (thin: parse, call the library, render)."""
