"""Tests of gpuplan's hub part."""
