"""Random programs and users for the engine's property tests (tests/test_engine_properties.py).

* :mod:`propgen.program` - program specs (hypothesis strategies) rendered as real Python source;
* :mod:`propgen.users`   - random graph/entry users, filters (with an independent model), steps;
* :mod:`propgen.harness` - imports a program as a module, runs it under the users, logs everything;
* :mod:`propgen.checker` - replays the log against the engine's contract;
* :mod:`propgen.known`   - minimal reproducers of the engine bugs these tests found, and probes
                           that let the random runs avoid those situations while the bugs exist.
"""

from propgen import known
from propgen.checker import Violation, check
from propgen.harness import Outcome, run
from propgen.program import Program, programs, render
from propgen.users import Action, UserSpec, actions, user_specs

__all__ = [
    "Action", "Outcome", "Program", "UserSpec", "Violation", "actions", "check", "known",
    "programs", "render", "run", "user_specs",
]
