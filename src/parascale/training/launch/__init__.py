"""The launching process's side of training: its checks and step plan before anything starts
(:mod:`.preflight`), the one local launch of a job (:mod:`.launcher`), and the module each
launched worker runs (:mod:`.worker`)."""
