//! The `anthropic` backend (being written).
