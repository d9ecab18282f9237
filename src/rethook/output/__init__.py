"""Output formats: ftrace's text views, and exports (Perfetto, folded stacks)."""
