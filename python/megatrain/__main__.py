"""python -m megatrain: the megatrain command (megatrain.cli)."""
from .cli import main

main()
