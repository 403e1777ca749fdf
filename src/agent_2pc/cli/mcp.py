"""Placeholder: the MCP helper replaces this module with `agent-2pc mcp` and `mcp wrap`."""

from .args import Command

MCP = Command("mcp", "serve agent-2pc to agents over the Model Context Protocol (stdio)",
              subcommands=(Command("wrap", "not built yet"),))
