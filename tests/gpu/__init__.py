"""The GPU tests, a package so that its conftest does not stand in for tests/conftest.py where a test imports from
conftest."""
