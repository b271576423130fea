"""The memory bound, measured: `probe` runs batches of growing cost on the device and reads
their peak memory (`inferq calibrate`); `fit` is the arithmetic and the file — the linear
fit, a budget turned into a token ceiling, and `resolve_ceiling`, the one place the
worker's starting ceiling is decided. Probing needs the device; fitting never touches it."""
