"""What a run's record is built from, for ``train`` and ``parascale run`` alike: where the run
stands (:mod:`.progress`), each epoch's entry from every rank's figures (:mod:`.epochs`),
time-to-target (:mod:`.target`), what the finished run hands over (:mod:`.summary`) and the
record's assembly (:mod:`.assemble`)."""
