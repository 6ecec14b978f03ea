"""Checkpoints: when one is due and writing it (:mod:`.writer`), what it holds and how a run
is put back (:mod:`.state`, sharded state in :mod:`.sharded`), its files on disk (:mod:`.disk`,
DCP's metadata read safely in :mod:`.dcp_metadata`), and which one a run continues from
(:mod:`.resume`)."""
