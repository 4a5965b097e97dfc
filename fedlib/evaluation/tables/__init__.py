"""Numbers printed in the papers, transcribed once, so the book can show them beside ours.

One module per paper: :mod:`~fedlib.evaluation.tables.afl`, :mod:`~fedlib.evaluation.tables.stsa`,
:mod:`~fedlib.evaluation.tables.fedtsne`, :mod:`~fedlib.evaluation.tables.refed`; every public name
is re-exported here (``tables.afl_table2()``, ``tables.refed_table1(printed=True)``...). Every frame
holds **the paper's** numbers on the paper's datasets, never ours. Sources:
``shared/papers/<paper>.md`` (transcribed from the seed texts).
"""
from fedlib.evaluation.tables.afl import *  # noqa: F401,F403
from fedlib.evaluation.tables.fedtsne import *  # noqa: F401,F403
from fedlib.evaluation.tables.refed import *  # noqa: F401,F403
from fedlib.evaluation.tables.stsa import *  # noqa: F401,F403
