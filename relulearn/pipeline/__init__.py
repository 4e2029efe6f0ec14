"""Streaming: sources -> chunks -> statistics -> blocks -> store."""
