"""Tests of gpuplan, mirroring the package; shared helpers in tests.helpers, shared fixtures in conftest.py."""
