"""The training loop: Trainer arguments from the plan, the attempts and the out-of-memory retry,
the audit of the live run, metrics, checkpoints, interrupts, the preference trainers and the calibration record."""
