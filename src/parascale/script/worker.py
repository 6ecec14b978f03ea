"""Entry point of one copy of a user's script under ``parascale run``
(``python -m parascale.script.worker``): see :mod:`parascale.script.running`."""
from parascale.script.running import main

if __name__ == "__main__":
    main()
