"""The model a run trains: loading or building it, the adapters and the 4-bit base, the patches
apply makes to its forward (activation offload, chunked loss), the base's files and the final directory."""
