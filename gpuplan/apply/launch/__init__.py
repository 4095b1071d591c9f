"""How a plan's training processes start and what they check first: the launcher per backend,
torchrun's command lines, one rank's entry point, the run lock and resume point around them,
the packages and the device a plan needs."""
