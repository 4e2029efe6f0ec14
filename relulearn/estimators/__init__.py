"""Downstream stages on stored statistics (spectral, enumeration, polish, learning methods)."""
