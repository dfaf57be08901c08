"""Unit tests of app/tenancy/."""
