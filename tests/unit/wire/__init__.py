"""Unit tests of llmgate_wire/."""
