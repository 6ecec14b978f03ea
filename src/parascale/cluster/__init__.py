"""Running training runs and studies as Slurm jobs (``parascale slurm``).

- :mod:`.script`: the job script, rendered from the train or bench options plus the Slurm ones,
  every value shell-quoted; what ``--dry-run`` prints is what ``--submit`` submits.
- :mod:`.scheduler`: sbatch, and a job's state and reason read from what this cluster keeps
  (squeue/scontrol while it remembers the job, sacct where accounting exists, the line
  slurmstepd writes into the job's output when it kills it).
- :mod:`.study`: a study as one job per configuration, the ledger of submitted jobs, status,
  and filing each run's record through the bench runner, so ``parascale report`` reads it.
- :mod:`.filing`: what a study's job runs after training, to file its record.

Rendering sbatch scripts ourselves was chosen over submitit: see docs/slurm.md.
"""
