"""fedlib's protocols on Flower (the optional ``flower`` extra: ``pip install -e '.[flower]'``).

:mod:`~fedlib.flower.records` turns fedlib messages into Flower records and back,
:mod:`~fedlib.flower.transport` runs :func:`fedlib.core.protocol.simulate` over a Flower Grid,
:mod:`~fedlib.flower.tasks` names each paper's run and the data a node holds,
:mod:`~fedlib.flower.apps` are the ServerApp / ClientApp, :mod:`~fedlib.flower.engines` the two ways to
run them (simulation engine, deployment on loopback); ``python -m fedlib.flower`` is the command line.
"""
