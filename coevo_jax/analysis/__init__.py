"""Statistics (rliable) and figures used by the studies' reports (host side)."""
