"""Every package names its public API in __all__, and every name there resolves."""

import importlib
import pkgutil

import gpuplan

PACKAGES = sorted(m.name for m in pkgutil.walk_packages(gpuplan.__path__, "gpuplan.") if m.ispkg) + ["gpuplan"]


def test_every_package_declares_a_public_api_that_resolves():
    for name in PACKAGES:
        pkg = importlib.import_module(name)
        assert pkg.__doc__, name
        assert isinstance(getattr(pkg, "__all__", None), (list, tuple)) and pkg.__all__, f"{name} has no __all__"
        for attr in pkg.__all__:
            assert getattr(pkg, attr) is not None, f"{name}.{attr}"
