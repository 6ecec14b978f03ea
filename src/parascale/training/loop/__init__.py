"""One worker's training: the run's parts built before the first step (:mod:`.setup`, what it
builds in :mod:`.run`), the loop over epochs (:mod:`.train`) and an epoch's steps
(:mod:`.step`), and what they use: the samples each rank sees (:mod:`.sampling`), the
learning-rate rule (:mod:`.lr`), evaluation (:mod:`.evaluate`), rank 0's lines
(:mod:`.lines`) and a search trial's pruner (:mod:`.pruning`)."""
