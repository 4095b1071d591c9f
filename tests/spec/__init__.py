"""Tests of gpuplan's spec part."""
