"""Tests of gpuplan's modelinfo part."""
