"""Imported by the fork server alone, first of :data:`.processes.PRELOAD`: the server dies with
the launcher that started it, even by SIGKILL and even while it is still importing torch, and
its workers die with it. (Its own exit when the launcher's pipe closes would come only after
its imports and the interpreter's clean-up after torch, seconds later.)"""
import os

from parascale.runtime.processes import die_with_parent

die_with_parent()
if os.getppid() == 1:  # the launcher died before the parent-death signal was armed
    os._exit(1)
