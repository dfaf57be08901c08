"""Unit tests of llmgate_client/."""
