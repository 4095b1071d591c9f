"""Tests of gpuplan's plan part."""
