"""The options ``parascale run`` takes, which the command line, a study of a script and a
Slurm job of one all need: kept here, below all three."""

#: the TrainConfig fields ``parascale run`` takes: where to run, how to synchronise, how to end,
#: where to write; the rest (model, data, batch, optimizer) is the script's own business
FIELDS = ("workers", "gpus", "device", "backend", "threads", "oversubscribe", "device_memory",
          "sync",
          "bucket_mb", "compression", "powersgd_rank", "period", "target_accuracy",
          "target_metric", "target_value", "port", "timeout", "out", "tensorboard")
