"""Tests of gpuplan's cli part."""
