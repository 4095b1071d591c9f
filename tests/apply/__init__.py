"""Tests of gpuplan's apply part."""
