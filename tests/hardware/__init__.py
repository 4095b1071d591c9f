"""Tests of gpuplan's hardware part."""
