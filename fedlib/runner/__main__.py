"""``python -m fedlib.runner NAME|all --profile P [name=value ...]``: execute chapters for the book."""
from fedlib.runner.cli import cli

cli()
