"""The process world: launching local workers, joining torchrun/srun worlds, devices, failures."""
from parascale.runtime.launch import Outcome, check_oversubscription, launch, open_store
from parascale.runtime.world import (World, external_launcher, external_size, join, joined,
                                     leave, resolve_backend, resolve_device_type)

__all__ = ["Outcome", "World", "check_oversubscription", "external_launcher", "external_size",
           "join", "joined", "launch", "leave", "open_store", "resolve_backend",
           "resolve_device_type"]
