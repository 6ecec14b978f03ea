"""One worker's training: the loop over epochs and steps (:mod:`.train`), what it builds
(:mod:`.run`), and what the step uses: the samples each rank sees (:mod:`.sampling`), the
learning-rate rule (:mod:`.lr`), evaluation (:mod:`.evaluate`), how an epoch is judged and said
(:mod:`.judging`) and a search trial's pruner (:mod:`.pruning`)."""
