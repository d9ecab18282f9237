"""``python -m emptypkg``: a package whose __init__ is empty; the work is in a submodule."""

from emptypkg import work

print(work.total(5))
