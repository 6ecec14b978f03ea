"""What the run measures and shows of itself as it trains: the step clock and statistics
(:mod:`.measure`), the profiler (:mod:`.profiling`), what else used the CPUs
(:mod:`.contention`), the divergence check (:mod:`.divergence`), the gradient noise scale
(:mod:`.noise`), memory by category (:mod:`.memory_split`), TensorBoard's event files
(:mod:`.tensorboard`) and rank 0's console log (:mod:`.console`)."""
