//! The `ollama` backend (being written).
