"""The clusters' fixtures: a real one-node Slurm cluster for the session (tests/helpers/slurm_cluster.py)."""

from __future__ import annotations

import os

import pytest

from tests.helpers import slurm_cluster


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """munged + slurmctld + slurmd on localhost, everything in a tmp dir, stopped after the session.

    Skipped only where Slurm is not installed (.ci/run installs slurm-wlm with apt-get when it can)
    or the daemons cannot run as root."""
    absent = slurm_cluster.missing()
    if absent:
        pytest.skip(
            f"Slurm is not installed here ({', '.join(absent)} missing): apt-get install -y {slurm_cluster.PACKAGE} "
            "(.ci/run installs it when apt-get can)"
        )
    if os.geteuid() != 0:
        pytest.skip("the one-node Slurm cluster runs munged, slurmctld and slurmd as root (SlurmUser=root); run the suite as root")
    cluster = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    yield cluster
    cluster.stop()
