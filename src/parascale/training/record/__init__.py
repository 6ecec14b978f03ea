"""What a run's record is built from, for ``train`` and ``parascale run`` alike: each epoch's
entry from every rank's figures (:mod:`.epochs`) and the record's assembly (:mod:`.assemble`)."""
