"""gpuplan: Terraform for GPU training runs."""

__version__ = "0.1.0"
