//! Unit tests of the sans-IO core.
