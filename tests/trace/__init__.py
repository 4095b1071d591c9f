"""Tests of gpuplan's trace part."""
