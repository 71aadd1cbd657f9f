"""qwen4exp's hyper-connection residual on few rows (a decode step, a verify window) in three launches a read:
write_stats.py (the pending write and each stream's RMS), down_inject.py (the low-rank down and the inject matvecs
on the normalised stack), up_mix.py (the up matvec, its sigmoid gate and the mean over streams). read.py drives them;
models/hyper_connections.py keeps the torch reference and picks."""
