"""The faces of canifinetune: the MCP server and the CLI, thin adapters over the core."""
