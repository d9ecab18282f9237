"""Small real programs the tests run under the engine and tracers."""
