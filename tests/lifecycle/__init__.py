"""Tests of gpuplan's lifecycle part."""
