"""BPF C sources, compiled by BCC when the agent starts (shipped as package data)."""
