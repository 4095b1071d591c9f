"""`gpuplan init`: a starter spec for a model and a GPU that plans cleanly, and what the user
named (a config, a model directory, a Hub id). Above plan/ in the layer order: it plans its draft."""
