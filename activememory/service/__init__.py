"""The service face (docs/design.md §12): `activememory serve` (HTTP/JSON API and the
inspector page) and `activememory mcp` (an MCP server), over the same public API as the
library: no rule is implemented twice. Imported only by those commands; the optional
dependencies come from the `serve` and `mcp` extras."""
