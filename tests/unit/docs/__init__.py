"""Unit tests of the docs against the code: what docs/ and README.md quote, list and run."""
